#!/usr/bin/env bash
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G \
  --long-path /nvme/kvd-long --long-bytes 256G &
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
