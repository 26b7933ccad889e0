#!/bin/bash
# Issue 19's measurements on the lent GPU machine, as one `run` call per stage, most important first.
#
#   call 1 (carry .whl1):  mkdir -p /tmp/parts && cp .whl1/*.part* /tmp/parts/
#   call 2 (carry .whl2):  CAP=540 bash benchmarks/gpu_lane_issue19.sh lean full
#   call 3 (carry .whl2):  CAP=540 bash benchmarks/gpu_lane_issue19.sh short graphs
#
# The device machine goes back after about 30 s idle: issue each call right after the previous one.
# Stages (each skipped when less than its estimate is left of CAP seconds):
#   lean    16k only, auto, layer-wise, 2 repeats, no token check        (~200 s)
#   full    16k + 1k partial, auto, layer-wise, with the token check      (~260 s)
#   tests   pytest tests/gpu                                               (~40 s)
#   short   the sweep's 512 and 1,024 lengths, auto, layer-wise           (~180 s)
#   sweep   the whole sweep, 512 .. 16k, and the 16k + 1k partial hit, auto, layer-wise, 2 repeats (~220 s)
#   graphs  16k + 1k partial, auto, layer-wise, without enforce_eager     (~400 s, compiles)
# Results land under $OUT/<stage>/ (results.json, the plot) and $OUT/<stage>-logs.tgz (engine and
# daemon logs, records.jsonl); a stage's per-hit split
# (vLLM's queue/step times, the worker's LEASE/load/DMA times, the busiest threads) prints with
#   python3 benchmarks/gpu_e2e_hits.py $OUT/<stage>/results.json
T0=$(date +%s)
CAP=${CAP:-540}
stamp() { echo "[lane] +$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( CAP - ($(date +%s) - T0) )); }
source .whl2/setup.sh >/dev/null || exit 3
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
e2e() {  # stage, estimate, gpu-e2e arguments...
  local stage=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then stamp "$stage skipped: $(left) s left of CAP, needs about $need"; return; fi
  timeout "$(left)" python3 -m infera.cli bench gpu-e2e --out "$OUT/$stage" "$@" > "$OUT/$stage.txt" 2>&1
  echo "$stage rc=$?"; grep -v '^\s*$' "$OUT/$stage.txt" | tail -24
  [ -f "$OUT/$stage/results.json" ] && python3 benchmarks/gpu_e2e_hits.py "$OUT/$stage/results.json" --kvd | tail -40
  grep -o "infera-kvd: a [0-9]*-chunk load[^\"]*" "$OUT/$stage.txt" | sort | uniq -c | head -8  # steps loaded whole
  grep -o "infera-kvd: \(recomputing a\|loading a\)[^\"]*" "$OUT/$stage.txt" | sort | uniq -c | head -8  # policy lines
  # the run hands back only so many files: the logs go into one archive per stage
  (cd "$OUT/$stage" 2>/dev/null && tar czf "../$stage-logs.tgz" ./*.log records.jsonl 2>/dev/null && rm -f ./*.log records.jsonl)
  stamp "$stage"
}
for stage in "$@"; do
  case $stage in
    lean) e2e lean 200 --sizes 16384 --partial '' --gemma3-sizes '' --no-check --repeat 2 --load-policy auto --layerwise ;;
    full) e2e full 260 --sizes 16384 --partial 1024 --gemma3-sizes '' --load-policy auto --layerwise ;;
    short) e2e short 180 --sizes 512,1024 --sweep 512,1024 --partial '' --gemma3-sizes '' --no-check --load-policy auto --layerwise ;;
    sweep) e2e sweep 240 --sizes 16384 --sweep default --partial 1024 --gemma3-sizes '' --no-check --repeat 2 --load-policy auto --layerwise ;;
    graphs) e2e graphs 400 --sizes 16384 --partial 1024 --gemma3-sizes '' --no-check --load-policy auto --layerwise --cuda-graphs --timeout 500 ;;
    tests)
      if [ "$(left)" -lt 40 ]; then stamp "tests skipped"; continue; fi
      timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu > "$OUT/pytest-gpu.log" 2>&1
      echo "tests rc=$?"; tail -2 "$OUT/pytest-gpu.log"; stamp tests ;;
    *) echo "unknown stage $stage (lean, full, tests, short, sweep, graphs)"; exit 2 ;;
  esac
done
