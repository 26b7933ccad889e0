#!/bin/bash
# GPU side of issue 20's run. From the repo root: bash .whlx/dev.sh MODE (tiny | b8 | env)
# The first call that carries .whl2 and .whlx sets up /tmp (vLLM bundle, Mooncake, router, wheels,
# system libraries, etcd) and copies this script to /tmp/gl/dev.sh for the later calls.
T0=$(date +%s); stamp() { echo "[dev] +$(( $(date +%s) - T0 ))s $*"; }
MODE=${1:-env}
if [ -d .whl2 ]; then source .whl2/setup.sh || exit 1; mkdir -p /tmp/gl && cp .whl2/setup.sh /tmp/gl/; else source /tmp/gl/setup.sh || exit 1; fi
[ -f .whlx/dev.sh ] && cp .whlx/dev.sh /tmp/gl/dev.sh
stamp "vllm bundle ready"
if [ ! -f /tmp/xp/.done ] && [ -f .whlx/xpack.tar.xz ]; then
  mkdir -p /tmp/xp && xz -dc -T8 .whlx/xpack.tar.xz | tar -xf - -C /tmp/xp || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 .whlx/w/*.whl 2>&1 | grep -v WARNING
  mkdir -p /tmp/syslib
  have=$(ldconfig -p | awk 'NR>1{print $1}')
  for f in /tmp/xp/sys/*.so*; do n=$(basename "$f"); echo "$have" | grep -qx "$n" || ln -sf "$f" "/tmp/syslib/$n"; done
  touch /tmp/xp/.done
fi
stamp "extras ready; libraries added: $(ls /tmp/syslib 2>/dev/null | tr '\n' ' ')"
CUDART=$(find /opt /usr/local -name 'libcudart.so.13*' 2>/dev/null | head -1)
CUDART=${CUDART:+$(dirname "$CUDART")}
export LD_LIBRARY_PATH=/tmp/syslib${CUDART:+:$CUDART}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD:/tmp/site:/tmp/site2:/tmp/xp/site PYTHONUNBUFFERED=1
ldd /tmp/xp/site/mooncake/engine.so | grep "not found"
python3 -c "
from mooncake.engine import TransferEngine
import vllm_router, uvicorn, prometheus_fastapi_instrumentator, model_hosting_container_standards, watchfiles, pyudev
import infera.kvd, infera.cli
print('[dev] imports ok')" 2>&1 | tail -3
stamp "import check done"
ETCD=/tmp/xp/sys/etcd
case "$MODE" in
  tiny)
    rm -rf /tmp/pd-tiny
    timeout -s TERM ${TINY_T:-530} python3 benchmarks/pd.py --tiny --lengths 1024,8192 --max-tokens 16 \
      --phases ${TINY_PHASES:-single,cold,hit,mixed,stale} --etcd-binary $ETCD --etcd 127.0.0.1:2379 \
      --gpu-memory-utilization 0.35 --transfer-protocol tcp --decode-debug --max-bytes 2G \
      --python python3 --workdir /tmp/pd-tiny --results $OUT/tiny.json --deadline ${TINY_D:-490} \
      --startup-timeout 240 2>&1 | grep -v "Writing model" | tee $OUT/tiny.out
    ;;
  b8)
    rm -rf /tmp/pd-b8
    timeout -s TERM ${B8_T:-540} python3 benchmarks/pd.py --llama8b --lengths 8192,16384 --max-tokens 16 \
      --phases ${B8_PHASES:-single,cold,hit,nokvd} --hit-after ${B8_HIT:-reset} --enforce-eager \
      --gpu-memory-utilization 0.35 --transfer-protocol tcp --max-bytes 8G --python python3 \
      --workdir /tmp/pd-b8 --results $OUT/b8.json --startup-timeout 300 2>&1 | tee $OUT/b8.out
    ;;
esac
stamp "$MODE done"
if [ -d /tmp/pd-$MODE ]; then
  (cd /tmp/pd-$MODE && tar -cJf $OUT/logs-$MODE.tar.xz --exclude=tiny --exclude=llama8b --exclude=etcd \
     --exclude=handoff --exclude='*.sock' --exclude='*.lock' . 2>/dev/null)
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader
stamp "end"
