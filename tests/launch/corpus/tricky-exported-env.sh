#!/usr/bin/env bash
# Environment set up front in several ways; the engine sees all of it.
set -euo pipefail
export PYTHONHASHSEED=0
SOCK=/var/run/infera-kvd.sock
export INFERA_KVD_SOCKET=$SOCK
set -a
INFERA_KVD_AIS=1
INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd
set +a
INFERA_KVD_CHUNK_TOKENS=64  # not exported: the engine never sees it
python -m infera.kvd --socket "$SOCK" --max-bytes 16G --long-path /nvme/kvd-long --long-bytes 256G &
python -m infera.engine.vllm --model m --enable-prefix-caching --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
