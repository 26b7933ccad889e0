#!/usr/bin/env bash
# The closing quote of the kv-transfer-config is missing: nothing else can be checked.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both"}
