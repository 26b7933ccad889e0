#!/usr/bin/env bash
# env VAR=... cmd, nohup, exec and numactl wrappers; env -u removes a variable again.
export PYTHONHASHSEED=0
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G &
nohup env INFERA_KVD_SOCKET=/var/run/infera-kvd.sock numactl --cpunodebind=0 --membind 0 \
  python -m infera.engine.vllm --model m --port 8000 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' > engine0.log 2>&1 &
env -u PYTHONHASHSEED INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \
  python -m infera.engine.vllm --model m --port 8001 --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}' &
INFERA_KVD_SOCKET=/run/other.sock exec python -m infera.engine.vllm --model m --port 8002 \
  --enable-prefix-caching --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
