#!/usr/bin/env bash
# The router lost --vllm-pd-disaggregation: a plain load balancer in front of a P/D pair.
python -m vllm_router.launch_router --host 0.0.0.0 --port 8000 --kv-connector mooncake \
  --prefill http://10.0.0.11:8001 8998 --decode http://10.0.0.12:8002
