#!/usr/bin/env bash
# No PYTHONHASHSEED: fine on vLLM >= 0.29 with sha256, a random seed per process on 0.28 and older.
INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
