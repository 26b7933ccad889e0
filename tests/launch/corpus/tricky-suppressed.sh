#!/usr/bin/env bash
# Known and accepted: this benchmark pins a small chunk size on purpose.
# kvd: ignore[KVD303]
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock INFERA_KVD_CHUNK_TOKENS=64 \
INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd2.sock INFERA_KVD_CHUNK_TOKENS=96 \
INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long \
python -m infera.engine.vllm --model m --port 8001 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'  # kvd: ignore[chunk-tokens-fixed]
