#!/usr/bin/env bash
# The same valid config written four ways; none of them is a problem.
# 1. double quotes with escaped inner quotes
PYTHONHASHSEED=0 INFERA_KVD_SOCKET="/var/run/infera-kvd.sock" python -m infera.engine.vllm --model m --port 8000 \
  --enable-prefix-caching \
  --kv-transfer-config "{\"kv_connector\":\"InferaKvdConnector\",\"kv_role\":\"kv_both\",\"kv_connector_module_path\":\"infera.engine.vllm.kvd_connector\"}" &
# 2. pieces in different quotes glued together, and --flag=value
PYTHONHASHSEED='0' INFERA_KVD_SOCKET=/var/run/'infera-kvd.sock' python -m infera.engine.vllm --model=m --port=8001 \
  --enable-prefix-caching \
  --kv-transfer-config='{"kv_connector":"InferaKvdConnector",'"\"kv_role\":\"kv_both\","'"kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
# 3. ANSI-C quoting
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python3.11 -u -m infera.engine.vllm --model m --port 8002 \
  --enable-prefix-caching \
  --kv-transfer-config $'{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
# 4. a "#" inside quotes is not a comment; an escaped space is part of the word
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model "org/model#main" \
  --served-model-name my\ model --port 8003 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
wait
