#!/usr/bin/env bash
# Two engines on one daemon: one pins the chunk size, the other leaves it at auto.
export PYTHONHASHSEED=0
export INFERA_KVD_SOCKET=/var/run/infera-kvd.sock
INFERA_KVD_CHUNK_TOKENS=4096 python -m infera.engine.vllm --model m --port 8000 \
  --enable-prefix-caching --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
python -m infera.engine.vllm --model m --port 8001 \
  --enable-prefix-caching --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
wait
