#!/usr/bin/env bash
# Values come from variables; a default from ${VAR:-...} is taken, an unknown $1 is not guessed.
SOCK=${KVD_SOCKET:-/var/run/infera-kvd.sock}
MODEL=$1
KTC='{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
python -m infera.kvd --socket "$SOCK" --max-bytes 16G &
PYTHONHASHSEED=0 INFERA_KVD_SOCKET="$SOCK" python -m infera.engine.vllm --model "$MODEL" \
  --enable-prefix-caching --kv-transfer-config "$KTC" &
PYTHONHASHSEED=0 INFERA_KVD_SOCKET="$(cat /etc/kvd-socket)" python -m infera.engine.vllm --model "$MODEL" \
  --port 8001 --enable-prefix-caching --kv-transfer-config "$KTC" &
PYTHONHASHSEED=1 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model "$MODEL" \
  --port 8002 --enable-prefix-caching --kv-transfer-config "$KTC" &
wait
