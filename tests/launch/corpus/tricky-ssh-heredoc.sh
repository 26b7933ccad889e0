#!/usr/bin/env bash
# A P/D rollout over ssh: each host's commands are read from the here-document or the quoted string.
ssh prefill-host bash -s <<'REMOTE'
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G &
PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock VLLM_HOST_IP=10.0.0.5 \
python -m infera.engine.vllm --model m --port 8001 \
  --advertise-host 10.0.0.5 --etcd-endpoint etcd:2379 \
  --discovery-backend etcd --request-transport http --kv-event-transport zmq \
  --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}'
REMOTE
ssh -p 2222 decode-host "PYTHONHASHSEED=0 VLLM_HOST_IP=10.0.0.6 python -m infera.engine.vllm --model m --port 8002 --advertise-host 10.0.0.6 --etcd-endpoint etcd:2379 --discovery-backend etcd --request-transport http --kv-event-transport zmq --kv-transfer-config '{\"kv_connector\":\"MooncakeConnector\",\"kv_role\":\"kv_consumer\"}'"
