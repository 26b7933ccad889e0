"""``kvd bench scale``, the concurrency part: N client processes doing put+get of large chunks
through one daemon, against N processes doing the same two copies with no daemon, in one run.

Each worker process is the loop of ``kvd bench arena`` (:func:`infera.bench.arena.put_get_span`
and :class:`infera.bench.arena.CopyLoop`) with its own key prefix. A worker makes its buffers (and
a memcpy worker faults in its mapping) before the round's barrier, so no worker's set-up runs
while another is timed; the aggregate is all bytes moved over the time from the first worker's
start to the last one's end (``time.perf_counter`` is the host's monotonic clock, one for every
process: with more workers than CPUs, each worker's own time leaves out the time it waited).
Both sides alternate round after round and each keeps its best, as ``kvd bench arena`` does. A
memcpy worker goes through as many chunk regions as a kvd worker's chunks take in the arena, and
a kvd worker has the whole arena in its page tables before it is timed (``KvdClient.prefault``).
Each round runs two patterns, each side by side with its own memcpy: one chunk a request (a PUT
and a GET per chunk, the harshest) and :data:`CONNECTOR_BATCH` chunks a request, as the vLLM
connector reserves and leases a step's chunks (the memcpy side then copies that many chunks in
and then out, the same order); the target is read from the second.

While 8 clients stream, this process sends LOOKUPs of 1,000 present keys and takes their p99,
next to the p99 of the same LOOKUPs with the daemon otherwise idle.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from infera.bench.arena import CONNECTOR_BATCH, CopyLoop, kvd_gbps, put_get_keys, put_get_span
from infera.bench.common import temp_daemon
from infera.bench.scale_index import lookup_samples, make_keys, percentiles, put_all
from infera.errors import KvdError

NS = "bench-scale-conc"
STREAM_CLIENTS = 8


def _worker(
    kind: str, sock: str, idx: int, size: int, rounds: int, stream_s: float, barrier: Any, q: Any, batch: int
) -> None:
    """One worker of a round; puts ``(idx, start, end, chunks streamed)`` on ``q``, or
    ``(idx, -1.0, 0.0, error)``."""
    try:
        if kind == "memcpy":
            loop = CopyLoop(size, rounds)
            loop.run(2)  # import costs out of the timed part
            barrier.wait()
            q.put((idx, *loop.run(rounds, batch), 0))
            loop.close()
            return
        from infera.kvd.client import KvdClient

        with KvdClient(sock, namespace=NS, name=f"kvd-bench-conc{idx}") as c:
            prefix = f"w{idx}"
            # warm-up: every page of this mapping in its page tables, as a long-lived engine's are
            # (the regions a round hands out were mostly touched by other clients: without it,
            # first touches, not copies, set the pace at 2 clients and more)
            c.prefault()
            kvd_gbps(c, size, rounds, prefix)
            src, dst, keys = os.urandom(size), bytearray(size), put_get_keys(prefix, rounds)
            barrier.wait()
            if not stream_s:
                q.put((idx, *put_get_span(c, src, dst, keys, batch), 0))
                return
            end = time.perf_counter() + stream_s
            n = 0
            while time.perf_counter() < end:
                put_get_span(c, src, dst, keys)
                n += rounds
            q.put((idx, 0.0, 0.0, n))
    except BaseException as exc:
        q.put((idx, -1.0, 0.0, repr(exc)))
        raise


def _round(
    kind: str, sock: str, clients: int, size: int, rounds: int, stream_s: float = 0.0, batch: int = 1
) -> list[Any]:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(clients + 1)
    q = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker, args=(kind, sock, i, size, rounds, stream_s, barrier, q, batch), daemon=True
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=120)
        results = [q.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    bad = [r for r in results if r[1] < 0]
    if bad:
        raise KvdError(f"benchmark: a {kind} worker failed: {bad[0][3]}")
    return results


def _span(results: list[Any]) -> float:
    """Seconds from the first worker's start to the last worker's end."""
    return max(r[2] for r in results) - min(r[1] for r in results)


def concurrency_points(
    clients: Sequence[int],
    size: int,
    total_chunks: int,
    repeats: int,
    stream_s: float,
    note: Callable[[str], None],
) -> dict[str, Any]:
    """Aggregate GB/s of put+get through one daemon and of plain memcpy, for each client count;
    then LOOKUP p50/p99 idle and while ``STREAM_CLIENTS`` clients stream."""
    arena = total_chunks * size + (64 << 20)
    rows = []
    from infera.kvd.client import KvdClient

    with temp_daemon("--max-bytes", str(arena)) as (sock, _proc):
        for n in clients:
            rounds = max(4, total_chunks // n)
            moved = 2 * size * rounds * n
            mem: list[float] = []
            kvd: list[float] = []
            mem_step: list[float] = []
            step: list[float] = []
            for r in range(repeats):
                note(f"concurrency: {n} clients, round {r + 1}/{repeats}")
                for out, kind, batch in (
                    (mem, "memcpy", 1),
                    (kvd, "kvd", 1),
                    (mem_step, "memcpy", CONNECTOR_BATCH),
                    (step, "kvd", CONNECTOR_BATCH),
                ):
                    out.append(moved / _span(_round(kind, sock, n, size, rounds, batch=batch)) / 1e9)
            rows.append(
                {
                    "clients": n,
                    "chunks_per_client": rounds,
                    "memcpy_gbps": max(mem),
                    "kvd_gbps": max(kvd),
                    "ratio": max(kvd) / max(mem),
                    "ratio_rounds": [round(k / m, 3) for k, m in zip(kvd, mem, strict=True)],
                    "memcpy_step_gbps": max(mem_step),
                    "kvd_step_gbps": max(step),
                    "ratio_step": max(step) / max(mem_step),
                    "ratio_step_rounds": [round(k / m, 3) for k, m in zip(step, mem_step, strict=True)],
                }
            )
        note(f"concurrency: LOOKUP while {STREAM_CLIENTS} clients stream")
        keys = make_keys(1000, tag=9)
        with KvdClient(sock, namespace=NS, name="kvd-bench-lookup") as c:
            put_all(c, keys)
            idle = percentiles(lookup_samples(c, keys, 200))
            # the streamers are driven from a thread of this process, while this one sends LOOKUPs
            import threading

            box: dict[str, Any] = {}
            th = threading.Thread(
                target=lambda: box.update(
                    r=_round(
                        "kvd", sock, STREAM_CLIENTS, size, max(4, total_chunks // STREAM_CLIENTS), stream_s
                    )
                )
            )
            th.start()
            time.sleep(min(1.0, stream_s / 4))  # the streamers connect and warm up first
            samples: list[float] = []
            while th.is_alive() and len(samples) < 100_000:
                samples += lookup_samples(c, keys, 20)
            th.join()
            if "r" not in box:
                raise KvdError("benchmark: the streaming clients did not finish")
            busy = percentiles(samples) if samples else {"p50_us": 0.0, "p99_us": 0.0}
    return {
        "chunk_bytes": size,
        "step_chunks": CONNECTOR_BATCH,
        "rows": rows,
        "lookup_idle_p50_us": idle["p50_us"],
        "lookup_idle_p99_us": idle["p99_us"],
        "lookup_streaming_p50_us": busy["p50_us"],
        "lookup_streaming_p99_us": busy["p99_us"],
        "lookup_streaming_samples": len(samples),
        "streamed_chunks": sum(r[3] for r in box["r"]),
        "stream_clients": STREAM_CLIENTS,
    }


__all__ = ["concurrency_points"]
