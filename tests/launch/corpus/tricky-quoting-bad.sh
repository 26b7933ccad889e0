#!/usr/bin/env bash
# Same as tricky-quoting.sh, but the glued config lost its kv_role: found on the right line.
PYTHONHASHSEED='0' INFERA_KVD_SOCKET=/var/run/'infera-kvd.sock' python -m infera.engine.vllm --model=m \
  --enable-prefix-caching \
  --kv-transfer-config='{"kv_connector":"InferaKvdConnector",'"\"kv_rol\":\"kv_both\","'"kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
