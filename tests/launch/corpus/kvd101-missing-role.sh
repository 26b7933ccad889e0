#!/usr/bin/env bash
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G &

PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --port 8000 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
