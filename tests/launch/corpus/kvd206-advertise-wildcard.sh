#!/usr/bin/env bash
# 0.0.0.0 is where to listen, not an address to advertise.
PYTHONHASHSEED=0 VLLM_HOST_IP=10.0.0.6 \
python -m infera.engine.vllm --model m --port 8002 --host 0.0.0.0 \
  --advertise-host 0.0.0.0 --etcd-endpoint etcd:2379 \
  --discovery-backend etcd --request-transport http --kv-event-transport zmq \
  --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'
