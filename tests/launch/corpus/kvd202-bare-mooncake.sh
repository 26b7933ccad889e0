#!/usr/bin/env bash
# kvd env added to the prefill leg, but the bare MooncakeConnector was not wrapped.
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock VLLM_HOST_IP=10.0.0.5 \
python -m infera.engine.vllm --model m --port 8001 \
  --advertise-host 10.0.0.5 --etcd-endpoint etcd:2379 \
  --discovery-backend etcd --request-transport http --kv-event-transport zmq \
  --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}'
