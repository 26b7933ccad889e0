"""Helpers shared by the benchmarks: a throwaway daemon, timing, and the result table."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from infera.errors import KvdError


@contextlib.contextmanager
def temp_daemon(*args: str, timeout: float = 20.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``python -m infera.kvd`` on a temporary socket for the duration of the block."""
    from infera.kvd.client import KvdClient, KvdClientError

    tmp = tempfile.mkdtemp(prefix="kvd-bench-", dir="/tmp")
    sock = os.path.join(tmp, "kvd.sock")
    log = open(os.path.join(tmp, "daemon.log"), "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "infera.kvd", "--socket", sock, "--log-level", "warning", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise KvdError(
                    "benchmark daemon exited at start: "
                    + Path(tmp, "daemon.log").read_text(errors="replace").strip()[-500:]
                )
            try:
                with KvdClient(sock, want_arena=False, timeout=2.0) as c:
                    c.ping()
                break
            except KvdClientError:
                if time.monotonic() > deadline:
                    raise KvdError("benchmark daemon did not start in time") from None
                time.sleep(0.02)
        yield sock, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def median_us(fn: Callable[[], Any], n: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def best_of(fn: Callable[[], float], runs: int = 3) -> float:
    """Run a throughput measurement several times and keep the best (least disturbed) figure."""
    return max(fn() for _ in range(runs))


def rss_anon_bytes(pid: int) -> int:
    """Anonymous resident memory of a process (excludes the shared arena mapping)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def machine_line() -> str:
    import platform

    return f"{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}"
