#!/usr/bin/env bash
# Every CPU benchmark of infera-kvd, one after another in one go, on one machine.
# Usage: benchmarks/run_all.sh [OUTDIR]     (needs `scripts/setup.sh --bench`; about 55 minutes on 2 cores)
# Each benchmark prints its own ratios against a baseline measured in the same run; this script only
# sequences them and keeps their output. The GPU benchmarks (`kvd bench transfer`, `kvd bench gpu-e2e`)
# run on a GPU host: see docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results}
mkdir -p "$OUT"
KVD=.venv/bin/kvd
run() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS
        "$@" 2>&1 | tee "$OUT/$name.txt"; echo "== $name took $((SECONDS - t0)) s"; }
uptime | tee "$OUT/load-before.txt"
run arena      $KVD bench arena
run disk       $KVD bench disk
run l4         $KVD bench l4
run top-render $KVD bench top-render
run ttft       $KVD bench ttft --python .venv-vllm032/bin/python --repeat 3
run compare    $KVD bench compare --out "$OUT/compare" --docs docs/benchmarks.md
run scale      $KVD bench scale --out "$OUT/scale"
uptime | tee "$OUT/load-after.txt"
