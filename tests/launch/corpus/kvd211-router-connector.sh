#!/usr/bin/env bash
# Mooncake legs, a router left at its default connector (nixl).
VLLM_HOST_IP=10.0.0.12 python -m infera.engine.vllm --model m --port 8002 --advertise-host 10.0.0.12 \
  --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'
vllm-router --port 8000 --vllm-pd-disaggregation \
  --decode http://10.0.0.12:8002 \
  --vllm-discovery-address 0.0.0.0:30001
