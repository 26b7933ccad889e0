#!/usr/bin/env bash
docker run --rm --network host -v /var/run:/var/run -v /boot:/boot:ro \
  -e PYTHONHASHSEED=0 -e INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
  infera:1 python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
