#!/usr/bin/env bash
INFERA_KVD_SOCKET=/run/kvd.sock INFERA_KVD_LOAD_POLICY=sometimes INFERA_KVD_LOAD_RATES=ram=1,ram=2 \
INFERA_KVD_LOAD_LAYERWISE=maybe INFERA_KVD_REGISTER=2 INFERA_KVD_COPY_KERNEL=cuda \
INFERA_KVD_GPU_STAGING_MB=0 INFERA_KVD_GPU_PATH_ON_CPU=x INFERA_KVD_REPORT_EVERY_S=-1 INFERA_KVD_SPIN_US=abc \
INFERA_KVD_HIPFILE_ROOTS=long=/nvme/a,long=/nvme/b PYTHONHASHSEED=0 \
python -m infera.engine.vllm --model m --enable-prefix-caching \
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
