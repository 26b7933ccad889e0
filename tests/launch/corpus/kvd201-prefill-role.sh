#!/usr/bin/env bash
# The MultiConnector kept kv_both at the top: the router registers prefill as MIXED.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock VLLM_HOST_IP=10.0.0.5 \
python -m infera.engine.vllm --model m --port 8001 --host 0.0.0.0 \
  --advertise-host 10.0.0.5 --etcd-endpoint etcd:2379 \
  --discovery-backend etcd --request-transport http --kv-event-transport zmq \
  --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}'
