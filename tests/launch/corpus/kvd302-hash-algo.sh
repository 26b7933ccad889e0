#!/usr/bin/env bash
export PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock
python -m infera.engine.vllm --model m --port 8000 --enable-prefix-caching \
  --prefix-caching-hash-algo sha256_cbor --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
python -m infera.engine.vllm --model m --port 8001 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
wait
