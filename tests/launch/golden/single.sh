#!/usr/bin/env bash
# infera-kvd single deployment, written by `kvd launch`; check it with `kvd lint launch.sh`.
#
# Usage: bash launch.sh [all|kvd|engine]
#   all             every process below, on this host
#   kvd             the kvd daemon only
#   engine          the engine and the kvd daemon it uses
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

start_engine() {
  PYTHONHASHSEED=0 \
  INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
  /opt/infera-kvd/.venv/bin/python -m infera.engine.vllm \
    --model meta-llama/Llama-3.1-8B-Instruct \
    --port 8000 \
    --host 0.0.0.0 \
    --enable-prefix-caching \
    --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
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
    start_engine & engines+=("$!")
    ;;
  kvd)
    start_kvd & daemons+=("$!")
    wait_for_socket /var/run/infera-kvd.sock "${daemons[-1]}"
    ;;
  engine)
    start_kvd & daemons+=("$!")
    wait_for_socket /var/run/infera-kvd.sock "${daemons[-1]}"
    start_engine & engines+=("$!")
    ;;
  *)
    echo "usage: bash launch.sh [all|kvd|engine]" >&2
    exit 2
    ;;
esac
if [ "${#engines[@]}" -gt 0 ]; then wait "${engines[@]}"; else wait "${daemons[@]}"; fi
