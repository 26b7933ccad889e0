#!/usr/bin/env bash
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=kvd.sock INFERA_KVD_AIS=yes INFERA_KVD_CHUNK_TOKENS=1000 \
python -m infera.engine.vllm --model m --block-size 16 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
