#!/usr/bin/env bash
# A long command over many lines; the finding points at the line of the bad flag.
PYTHONHASHSEED=0 \
INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
  python \
    -m infera.engine.vllm \
    --model m \
    --port 8000 \
    --host 0.0.0.0 \
    --no-enable-prefix-caching \
    --kv-transfer-config \
      '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
