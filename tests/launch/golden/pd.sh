#!/usr/bin/env bash
# infera-kvd pd deployment, written by `kvd launch`; check it with `kvd lint launch.sh`.
#
# Usage: bash launch.sh [all|kvd|prefill|decode|router]
#   all             every process below, on this host
#   kvd             the kvd daemon only
#   prefill         the prefill engine and the kvd daemon it uses
#   decode          the decode engine
#   router          vllm-router, in front of the legs; restart it after restarting the prefill engine
#
# Each start_* function holds one command as you would type it: paste its body to run it by hand.
set -euo pipefail

start_kvd() {
  /opt/infera-kvd/.venv/bin/python -m infera.kvd \
    --socket /var/run/infera-kvd.sock \
    --max-bytes 16G \
    --long-path /nvme/kvd-long \
    --long-bytes 256G
}

start_prefill() {
  PYTHONHASHSEED=0 \
  INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
  INFERA_KVD_AIS=1 \
  INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long \
  VLLM_HOST_IP=10.0.0.5 \
  /opt/infera-kvd/.venv/bin/python -m infera.engine.vllm \
    --model meta-llama/Llama-3.1-8B-Instruct \
    --port 8001 \
    --host 0.0.0.0 \
    --advertise-host 10.0.0.5 \
    --etcd-endpoint etcd.internal:2379 \
    --discovery-backend etcd \
    --request-transport http \
    --kv-event-transport zmq \
    --enable-prefix-caching \
    --kv-transfer-config '{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}'
}

start_decode() {
  PYTHONHASHSEED=0 \
  VLLM_HOST_IP=10.0.0.6 \
  /opt/infera-kvd/.venv/bin/python -m infera.engine.vllm \
    --model meta-llama/Llama-3.1-8B-Instruct \
    --port 8002 \
    --host 0.0.0.0 \
    --advertise-host 10.0.0.6 \
    --etcd-endpoint etcd.internal:2379 \
    --discovery-backend etcd \
    --request-transport http \
    --kv-event-transport zmq \
    --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'
}

start_router() {
  /opt/infera-kvd/.venv/bin/python -m vllm_router.launch_router \
    --host 0.0.0.0 \
    --port 8000 \
    --vllm-pd-disaggregation \
    --kv-connector mooncake \
    --prefill http://10.0.0.5:8001 8998 \
    --decode http://10.0.0.6:8002
}

wait_for_socket() {
  local _
  for _ in $(seq 600); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "kvd launch: the kvd daemon exited" >&2; return 1; }
    sleep 0.1
  done
  echo "kvd launch: no kvd socket at $1 after 60 s" >&2
  return 1
}

set -m  # each process gets its own process group, so stopping it stops its children too
daemons=()
engines=()
stop_all() {
  local pid
  for pid in "${engines[@]}" "${daemons[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

part=${1:-all}
case "$part" in
  all)
    start_kvd & daemons+=("$!")
    wait_for_socket /var/run/infera-kvd.sock "${daemons[-1]}"
    start_prefill & engines+=("$!")
    start_decode & engines+=("$!")
    start_router & engines+=("$!")
    ;;
  kvd)
    start_kvd & daemons+=("$!")
    wait_for_socket /var/run/infera-kvd.sock "${daemons[-1]}"
    ;;
  prefill)
    start_kvd & daemons+=("$!")
    wait_for_socket /var/run/infera-kvd.sock "${daemons[-1]}"
    start_prefill & engines+=("$!")
    ;;
  decode)
    start_decode & engines+=("$!")
    ;;
  router)
    start_router & engines+=("$!")
    ;;
  *)
    echo "usage: bash launch.sh [all|kvd|prefill|decode|router]" >&2
    exit 2
    ;;
esac
if [ "${#engines[@]}" -gt 0 ]; then wait "${engines[@]}"; else wait "${daemons[@]}"; fi
