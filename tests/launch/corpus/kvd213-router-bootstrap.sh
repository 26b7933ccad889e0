#!/usr/bin/env bash
# The prefill leg moved its Mooncake bootstrap server; the router still asks 8998.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock VLLM_HOST_IP=10.0.0.11 VLLM_MOONCAKE_BOOTSTRAP_PORT=9100 \
python -m infera.engine.vllm --model m --port 8001 --advertise-host 10.0.0.11 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}'
python -m vllm_router.launch_router --port 8000 --vllm-pd-disaggregation --kv-connector mooncake \
  --prefill http://10.0.0.11:8001 8998 \
  --decode http://10.0.0.12:8002
