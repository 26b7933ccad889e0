#!/usr/bin/env bash
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G &
PYTHONHASHSEED=0 python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
