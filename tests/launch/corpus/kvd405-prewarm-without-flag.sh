#!/usr/bin/env bash
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --port 8000 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
sleep 60
curl -s -X POST http://127.0.0.1:8000/v1/cache/prewarm -H 'content-type: application/json' -d '{"prompt": "system prompt"}'
wait
