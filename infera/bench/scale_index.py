"""``kvd bench scale``, the index parts: how LOOKUP, GET, PUT, eviction and memory grow with the
number of chunks one daemon indexes, and with the number of namespaces they are spread over.

Chunks are empty (0-byte payloads): each still takes one 4 KiB arena slot and one index entry, but
no arena page is ever touched, so a million of them cost no RAM beyond the index itself. Every
daemon is fresh, on a temporary socket; memory is the growth of its anonymous resident memory
(the arena is shared memory and not counted).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from infera.bench.common import temp_daemon, timed
from infera.bench.procfs import cpu_seconds, rss_anon_bytes
from infera.errors import KvdError

NS = "bench-scale"
SLOT = 4096  # the arena slot of an empty chunk (infera.kvd.arena.ALIGN)
PUT_BATCH = 5000
LOOKUP_KEYS = 1000


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of ``samples`` (seconds) in microseconds."""
    s = sorted(samples)
    return {"p50_us": statistics.median(s) * 1e6, "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6}


def make_keys(n: int, tag: int = 0) -> list[bytes]:
    """``n`` distinct 32-byte keys (block-hash-like: random bytes, a counter in the last 8)."""
    head = os.urandom(24)
    return [head + (tag << 40 | i).to_bytes(8, "big") for i in range(n)]


def put_all(c: Any, keys: Sequence[bytes], retention: str = "short") -> float:
    """PUT every key as an empty chunk, ``PUT_BATCH`` keys a request; returns seconds taken."""
    t = time.perf_counter()
    for i in range(0, len(keys), PUT_BATCH):
        if not all(c.put_many([(k, b"") for k in keys[i : i + PUT_BATCH]], retention=retention)):
            raise KvdError("benchmark: the daemon refused an empty chunk")
    # the last SEAL went without a reply and a big one is handled over several turns: a round
    # trip on this connection comes back after it, so other connections see every chunk
    c.ping()
    return time.perf_counter() - t


def fresh(keys: Sequence[bytes]) -> list[bytes]:
    """Copies of ``keys`` in new objects, side by side in memory, as an engine's block hashes for
    one prompt are (computed just before its LOOKUP). Without the copy the client would read
    1,000 objects scattered over its own list of every key, which costs it ~100 µs more with a
    million keys than with 10k: the benchmark client's caches, not the daemon's index."""
    return [bytes(memoryview(k)) for k in keys]


def lookup_samples(c: Any, keys: Sequence[bytes], reps: int, n: int = LOOKUP_KEYS) -> list[float]:
    """Round trips of LOOKUP of ``n`` present keys, a fresh random sample each time (a repeated
    sample would stay in the daemon's CPU caches, which a real engine's keys do not), in fresh
    objects (:func:`fresh`)."""
    rng = random.Random(7)
    samples = [fresh(rng.sample(keys, n)) for _ in range(reps + 5)]
    it = iter(samples)

    def one() -> None:
        if c.lookup(next(it)) != n:
            raise KvdError("benchmark: LOOKUP missed keys it had just stored")

    return timed(one, reps)


def prompt_lookup_samples(c: Any, keys: Sequence[bytes], reps: int, n: int = LOOKUP_KEYS) -> list[float]:
    """Round trips of LOOKUP of ``n`` keys in the order they were stored (a prompt's chunks, as
    an engine asks for them), a window at a fresh random place each time, in fresh objects."""
    rng = random.Random(13)
    starts = rng.sample(range(0, len(keys) - n + 1), min(reps + 5, len(keys) - n + 1))
    it = iter(starts * (1 + (reps + 5) // max(1, len(starts))))
    windows = {i: fresh(keys[i : i + n]) for i in starts}

    def one() -> None:
        if c.lookup(windows[next(it)]) != n:
            raise KvdError("benchmark: LOOKUP missed keys it had just stored")

    return timed(one, reps)


def index_point(n: int, reps: int, get_reps: int, evict_keys: int) -> dict[str, Any]:
    """One daemon with exactly ``n`` slots, filled with ``n`` empty chunks; then the figures."""
    from infera.kvd.client import KvdClient

    keys = make_keys(n)
    with (
        temp_daemon("--max-bytes", str(n * SLOT)) as (sock, proc),
        KvdClient(sock, namespace=NS, name="kvd-bench-scale") as c,
    ):
        c.ping()
        base = rss_anon_bytes(proc.pid)
        fill_s = put_all(c, keys)
        st = c.stats()
        if st["chunks"] != n:
            raise KvdError(f"benchmark: expected {n} chunks indexed, the daemon has {st['chunks']}")
        grown = rss_anon_bytes(proc.pid) - base
        cpu = cpu_seconds(proc.pid)
        look = percentiles(lookup_samples(c, keys, reps))
        # the daemon's own CPU per LOOKUP: what the index costs, less exposed to a loaded host's
        # scheduling than a round trip (10 ms ticks over the reps: a few percent)
        look_cpu_us = (cpu_seconds(proc.pid) - cpu) / (reps + 5) * 1e6
        prompt = percentiles(prompt_lookup_samples(c, keys, reps))
        rng = random.Random(11)
        probes = iter([rng.choice(keys) for _ in range(get_reps + 5)])
        get = percentiles(timed(lambda: c.get(next(probes)), get_reps))
        # the arena is exactly full: each new key evicts the least recently used chunk
        fresh = make_keys(evict_keys, tag=1)
        before = c.stats()["evictions_total"]
        evict_s = put_all(c, fresh)
        evicted = c.stats()["evictions_total"] - before
        if evicted != evict_keys:
            raise KvdError(f"benchmark: {evict_keys} PUTs into a full arena evicted {evicted} chunks")
    put_us = fill_s / n * 1e6
    evict_put_us = evict_s / evict_keys * 1e6
    return {
        "chunks": n,
        "bytes_per_chunk": grown / n,
        "lookup1000_p50_us": look["p50_us"],
        "lookup1000_p99_us": look["p99_us"],
        "lookup1000_daemon_cpu_us": look_cpu_us,
        "lookup_prompt_p50_us": prompt["p50_us"],
        "lookup_prompt_p99_us": prompt["p99_us"],
        "get_p50_us": get["p50_us"],
        "get_p99_us": get["p99_us"],
        "put_chunks_per_s": n / fill_s,
        "put_us_per_chunk": put_us,
        "put_evicting_us_per_chunk": evict_put_us,
        "eviction_us_per_chunk": evict_put_us - put_us,
        "evicted": evicted,
    }


def namespaces_point(spaces: int, chunks: int, reps: int) -> dict[str, Any]:
    """``chunks`` empty chunks spread over ``spaces`` clients, one namespace each, connected at
    once; LOOKUP of up to 1,000 keys of one namespace, and memory per chunk."""
    from infera.kvd.client import KvdClient

    per = chunks // spaces
    n_look = min(LOOKUP_KEYS, per)
    with temp_daemon("--max-bytes", str(chunks * SLOT)) as (sock, proc):
        clients = [KvdClient(sock, namespace=f"{NS}-{i}", name=f"kvd-bench-ns{i}") for i in range(spaces)]
        try:
            for c in clients:
                c.ping()
            base = rss_anon_bytes(proc.pid)
            keys = [make_keys(per, tag=i) for i in range(spaces)]
            t = time.perf_counter()
            for c, ks in zip(clients, keys, strict=True):
                put_all(c, ks)
            put_s = time.perf_counter() - t
            grown = rss_anon_bytes(proc.pid) - base
            st = clients[0].stats()
            if st["chunks"] != per * spaces:
                raise KvdError(f"benchmark: expected {per * spaces} chunks, the daemon has {st['chunks']}")
            look = percentiles(lookup_samples(clients[-1], keys[-1], reps, n_look))
        finally:
            for c in clients:
                c.close()
    return {
        "namespaces": spaces,
        "chunks": per * spaces,
        "lookup_keys": n_look,
        "lookup_p50_us": look["p50_us"],
        "lookup_p99_us": look["p99_us"],
        "bytes_per_chunk": grown / (per * spaces),
        "put_chunks_per_s": per * spaces / put_s,
    }


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The exponent b of y = a * x**b through the first and last point (log-log slope): 0 means
    flat, 1 linear; None when a value is not positive."""
    import math

    (x0, y0), (x1, y1) = points[0], points[-1]
    if min(x0, y0, x1, y1) <= 0 or x0 == x1:
        return None
    return math.log(y1 / y0) / math.log(x1 / x0)


__all__ = ["index_point", "make_keys", "namespaces_point", "percentiles", "put_all", "slope"]
