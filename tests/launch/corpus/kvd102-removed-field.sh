#!/usr/bin/env bash
# kv_buffer_size is a leftover from an old guide; vLLM 0.32 removed it.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_buffer_size":1e9,"kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
