#!/usr/bin/env bash
# The env is there, the connector is not: vLLM does not add it by itself.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
python -m infera.engine.vllm --model m --port 8000 --enable-prefix-caching
