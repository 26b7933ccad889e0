#!/usr/bin/env bash
# The JSON's double quotes end the outer double-quoted ssh command: the remote shell receives
# --kv-transfer-config '{kv_connector:MooncakeConnector,kv_role:kv_consumer}', which is not JSON.
ssh decode-host "PYTHONHASHSEED=0 VLLM_HOST_IP=10.0.0.6 python -m infera.engine.vllm --model m --port 8002 --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'"
