"""What a ``kvd bench gpu-e2e`` engine process reads around a timed request: the daemon's
counters for this engine's scheduler and worker clients, whether its saves and prewarms have
landed, and which threads of the engine used the CPU meanwhile."""

from __future__ import annotations

import os
import time
from pathlib import Path


def worker_counters(model_path: str, role: str = "vllm-worker") -> dict[str, float]:
    from infera.kvd.client import KvdClient, KvdClientError

    try:
        with KvdClient(os.environ["INFERA_KVD_SOCKET"], want_arena=False, timeout=5) as c:
            for cl in c.stats().get("clients", []):
                if str(cl.get("role", "")).startswith(role) and cl.get("model") == model_path:
                    return dict(cl.get("counters") or {})
    except KvdClientError:
        pass
    return {}


def wait_stored(timeout: float = 120.0) -> float:
    """Until the daemon's chunk count stops growing (saves are sealed after their DMA) and its
    disk writes are done (so they do not run under the measured hits)."""
    from infera.kvd.client import KvdClient

    started = time.monotonic()
    last, stable = -1, 0
    with KvdClient(os.environ["INFERA_KVD_SOCKET"], want_arena=False, timeout=5) as c:
        while time.monotonic() - started < timeout:
            st = c.stats()
            n = int(st.get("sets_total", 0))
            long = (st.get("tiers") or {}).get("long") or {}
            busy = int(long.get("queued_writes", 0) or 0) + int(long.get("backlog", 0) or 0)
            stable = stable + 1 if n == last and not busy else 0
            if stable >= 3:
                break
            last = n
            time.sleep(0.1)
    return time.monotonic() - started


def prewarmed_total() -> int:
    from infera.kvd.client import KvdClient

    with KvdClient(os.environ["INFERA_KVD_SOCKET"], want_arena=False, timeout=5) as c:
        return int(((c.stats().get("tiers") or {}).get("long") or {}).get("prewarmed", 0) or 0)


def wait_prewarmed(since: int, chunks: int, timeout: float = 20.0) -> float:
    """Until the daemon promoted ``chunks`` more chunks than ``since`` (the disk hits' prewarms)."""
    started = time.monotonic()
    while chunks > 0 and prewarmed_total() < since + chunks and time.monotonic() - started < timeout:
        time.sleep(0.05)
    return time.monotonic() - started


def scheduler_counters(model_path: str) -> dict[str, float]:
    return worker_counters(model_path, "vllm-scheduler")


def thread_cpu() -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds of every thread of this process's children (the engine core and its
    workers), by (pid, tid), with the thread's name: what else ran while a request was timed."""
    try:
        import psutil
    except ImportError:
        return {}
    got: dict[tuple[int, int], tuple[str, float]] = {}
    for p in psutil.Process().children(recursive=True):
        try:
            for t in p.threads():
                try:
                    name = Path(f"/proc/{p.pid}/task/{t.id}/comm").read_text().strip()
                except OSError:
                    name = "?"
                got[(p.pid, t.id)] = (name, t.user_time + t.system_time)
        except psutil.Error:
            continue
    return got


def busiest(
    before: dict[tuple[int, int], tuple[str, float]], after: dict[tuple[int, int], tuple[str, float]]
) -> list:
    """The three threads that used the most CPU between two snapshots: [name, ms]."""
    used = [(name, (s - before.get(k, (name, 0.0))[1]) * 1000) for k, (name, s) in after.items()]
    return [[n, round(ms, 1)] for n, ms in sorted(used, key=lambda x: -x[1])[:3]]
