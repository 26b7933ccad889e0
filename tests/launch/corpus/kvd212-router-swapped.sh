#!/usr/bin/env bash
# The router's --prefill and --decode URLs are swapped.
VLLM_HOST_IP=10.0.0.12 python -m infera.engine.vllm --model m --port 8002 --advertise-host 10.0.0.12 \
  --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'
python -m vllm_router.launch_router --port 8000 --vllm-pd-disaggregation --kv-connector mooncake \
  --prefill http://10.0.0.12:8002 \
  --decode http://10.0.0.11:8001
