#!/usr/bin/env bash
# Single quotes inside the JSON: the shell is happy, vLLM is not.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config "{'kv_connector':'InferaKvdConnector','kv_role':'kv_both'}"
