"""Helpers shared by the launch tests (and tests/vllm/test_launch_*.py): run the CLI, run emitted scripts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

HERE = Path(__file__).resolve().parent
STUB = HERE / "stub_python.py"

# `kvd launch` deployments every format is checked with (kvd lint, read-back, the real validators)
VARIANTS = {
    "single": ["single", "--model", "m"],
    "single-disk-ais-prewarm": [
        "single", "--model", "m", "--long-path", "/nvme/kvd-long", "--long-bytes", "256G", "--ais",
        "--hipfile-root", "scratch=/scratch/kvd", "--prewarm", "--port", "9000",
    ],
    "single-mooncake": [
        "single", "--model", "m", "--long-backend", "mooncake", "--mooncake-master", "10.0.0.9:50051",
        "--mooncake-protocol", "tcp",
    ],
    "single-lmcache": ["single", "--model", "m", "--long-backend", "lmcache", "--lmcache-url", "lm://10.0.0.9:65432"],
    "pd": ["pd", "--model", "m", "--etcd", "etcd:2379", "--advertise-host", "10.0.0.5"],
    "pd-ais-prewarm": [
        "pd", "--model", "m", "--etcd", "etcd:2379", "--advertise-host", "10.0.0.5", "--decode-advertise-host",
        "10.0.0.6", "--long-path", "/nvme/kvd-long", "--long-bytes", "256G", "--ais", "--prewarm",
    ],
    # quoting: spaces, quotes, dollars and percents must survive every format
    "single-awkward-values": [
        "single", "--model", "org/model with space", "--python", "/opt/my venv/bin/python",
        "--socket", "/run/kvd 1/kvd.sock", "--engine-arg=--served-model-name=it's $HOME at 100%",
        "--engine-arg=--chat-template={{ messages }}", "--daemon-arg=--metrics-port=9400",
    ],
}  # fmt: skip


def local_args(kind: str, sock: str) -> list[str]:
    """`kvd launch single|pd` arguments for a run on this machine: a 64M daemon on ``sock``, and for
    ``pd`` a loopback etcd."""
    if kind == "single":
        return ["single", "--model", "m", "--socket", sock, "--max-bytes", "64M"]
    return [
        "pd", "--model", "m", "--etcd", "127.0.0.1:2379", "--advertise-host", "10.0.0.5",
        "--socket", sock, "--max-bytes", "64M",
    ]  # fmt: skip


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


def kvd(*args: str, stdin: str | None = None) -> CliResult:
    """Run the `kvd` app in-process (fast) and return exit code, stdout and stderr."""
    from infera.cli import app

    runner = CliRunner()
    res = runner.invoke(app, list(args), input=stdin)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return CliResult(res.exit_code, res.stdout, res.stderr)


def launch_json(*args: str) -> dict[str, Any]:
    res = kvd("launch", *args, "--format", "json")
    assert res.code == 0, res.stderr
    return json.loads(res.stdout)


def make_stub(tmp: Path) -> dict[str, str]:
    """A `python` first on PATH that runs the real daemon and records engine commands; returns the env."""
    bindir = tmp / "bin"
    rec = tmp / "records"
    bindir.mkdir(exist_ok=True)
    rec.mkdir(exist_ok=True)
    shim = bindir / "python"
    shim.write_text(f'#!/bin/sh\nexec "$KVD_STUB_REAL_PYTHON" {STUB} "$@"\n')
    shim.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INFERA_KVD_", "PYTHONHASHSEED", "VLLM_HOST_IP"))
    }
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        KVD_STUB_REAL_PYTHON=sys.executable,
        KVD_STUB_RECORDS=str(rec),
    )
    return env


def run_script(
    script: str, tmp: Path, *args: str, timeout: float = 60
) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``script`` with bash and the stub; return (exit status, engine records, combined output)."""
    env = make_stub(tmp)
    path = tmp / "launch.sh"
    path.write_text(script)
    proc = subprocess.Popen(
        ["bash", str(path), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"script did not finish:\n{out.decode(errors='replace')}") from None
    records = [json.loads(p.read_text()) for p in sorted((tmp / "records").glob("*.json"))]
    return proc.returncode, records, out.decode(errors="replace")


def wait_gone(path: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not path.exists():
            return True
        time.sleep(0.05)
    return False
