"""``kvd bench l4``: put and get of 4 MiB chunks through kvd into Mooncake, against Mooncake's own
client doing the same, in one run.

Both sides run as their own processes against one throwaway cluster (a ``mooncake_master`` and
a ``mooncake_client`` storage node on loopback, or ``--master``/``--metadata`` of a running one)
and move the same number of chunks with the same concurrency:

* Mooncake alone: ``put_from`` / ``get_into`` of registered memory from ``THREADS`` threads (the
  baseline), and for reference the scatter/gather calls kvd uses (4 KiB header + payload).
* kvd put: a client reserves and fills arena regions of daemon A (the engine's copy, untimed),
  then seals them in requests of ``--batch``; timed until A's writer lanes (``THREADS`` of them)
  report every chunk stored in Mooncake (header built and checksummed, scatter/gather put).
* kvd get: a client GETs the chunks from daemon B, whose RAM is empty, in requests of
  ``--batch`` keys; B's reader threads copy them from Mooncake into its arena and verify them.
  The client takes leases (the data is in the shared arena, where an engine reads it), no copy.

The ratio (Mooncake's time / kvd's time, per round, median over rounds) is the figure of merit
(target >= 0.9). Each round runs the two sides back to back, so load from elsewhere on the host
tends to hit both. Both sides first make one untimed pass, so neither pays for first-touch page
faults (of the storage node's segment, of the daemons' arenas) in its figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infera.bench.args import at_least, size_at_least
from infera.bench.common import machine_line, temp_daemon
from infera.bench.services import mooncake_cluster
from infera.errors import KvdError, UsageError
from infera.kvd.flags.parse import parse_master
from infera.units import format_size

THREADS = 2  # the daemon's writer lanes and reader threads
WRITE_WAIT_S = 60.0  # a refused write is retried after 1, 2, 4, 8, 16 s: room for all of them


BASELINE = r"""
import ctypes, json, os, sys, threading, time
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
from mooncake.store import MooncakeDistributedStore
master, meta, size, count, threads, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
H = 4096
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", meta, 0, 16 << 20, "tcp", "", master) == 0
n = (size + H) * threads
buf = ctypes.create_string_buffer(n); base = ctypes.addressof(buf)
ctypes.memmove(base, os.urandom(n), n)
assert s.register_buffer(base, n) == 0
def run(op, api, keys):
    errors = []
    def work(t):
        p = base + t * (size + H)
        for k in keys[t::threads]:
            if api == "plain":
                rc = s.put_from(k, p, size) if op == "put" else s.get_into(k, p, size)
                want = size
            elif op == "put":
                rc = s.batch_put_from_multi_buffers([k], [[p, p + H]], [[H, size]])[0]
            else:
                rc = s.batch_get_into_multi_buffers([k], [[p, p + H]], [[H, size]])[0]
                want = size + H
            if (op == "put" and rc != 0) or (op == "get" and rc != want):
                errors.append(rc)
    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.perf_counter() - t0
    if errors: raise SystemExit(f"{op} ({api}) failed: {errors[:5]}")
    return dt
out = {}
warm = [f"bench/{tag}/warm/{i}" for i in range(count)]  # touch the storage node's pages first
run("put", "plain", warm); run("get", "plain", warm); s.batch_remove(warm, True)
for api in ("plain", "multi"):
    keys = [f"bench/{tag}/{api}/{i}" for i in range(count)]
    out[f"put_s_{api}"] = run("put", api, keys)
    out[f"get_s_{api}"] = run("get", api, keys)
    s.batch_remove(keys, True)
print(json.dumps(out))
s.close()
"""


def mooncake_alone(master: str, meta: str, size: int, count: int, tag: str) -> dict[str, float]:
    env = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
    res = subprocess.run(
        [sys.executable, "-c", BASELINE, master, meta, str(size), str(count), str(THREADS), tag],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if res.returncode != 0:
        raise KvdError("Mooncake baseline failed: " + (res.stderr or res.stdout).strip()[-400:])
    out: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _long(client: Any) -> dict[str, Any]:
    long: dict[str, Any] = client.stats()["tiers"]["long"]
    return long


def _wait_ready(client: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (s := _long(client))["state"] != "ready":
        if time.monotonic() > deadline:
            why = s.get("last_error") or "no error reported"
            raise KvdError(f"the daemon's Mooncake tier is still {s['state']} after {timeout:.0f} s: {why}")
        time.sleep(0.05)


def _check_master(master: str) -> None:
    """``--master`` answers on its port: fail now, not after the daemons' 30 s wait."""
    try:
        host, port = parse_master(master)
    except UsageError:
        raise UsageError(f"--master: {master!r} is not HOST:PORT", hint="e.g. 10.0.0.5:50051") from None
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        raise KvdError(
            f"the Mooncake master {master} does not answer ({exc.strerror or exc})",
            hint="start it, or leave out --master and --metadata for a throwaway cluster on loopback",
        ) from None


def through_kvd(a_sock: str, b_sock: str, size: int, count: int, batch: int, tag: str) -> dict[str, float]:
    from infera.kvd.client import KvdClient

    payload = os.urandom(size)
    keys = [f"{tag}-{i}".encode() for i in range(count)]
    with KvdClient(a_sock, namespace="bench") as a, KvdClient(b_sock, namespace="bench") as b:
        _wait_ready(a)
        _wait_ready(b)
        s0 = _long(a)
        done0, failed0, postponed0 = s0["chunks_written"], s0["failed_writes"], s0["backpressure"]
        # The engine's copy into the arena is not kvd's work (on a GPU host it is a DMA): fill
        # the regions first, then time from the seals to the last chunk stored in Mooncake.
        slots = a.reserve(keys, [size] * count)
        tokens = []
        for slot in slots:
            if not isinstance(slot, tuple):
                raise KvdError(f"cannot reserve room in the benchmark daemon: {slot}")
            a.arena[slot[1] : slot[1] + size] = payload
            tokens.append(slot[0])
        t0 = time.perf_counter()
        for i in range(0, count, batch):
            a.seal(tokens[i : i + batch])
        deadline = time.monotonic() + WRITE_WAIT_S
        while True:
            s = _long(a)
            if s["chunks_written"] - done0 >= count and s["queued_writes"] == 0:
                break
            if s["failed_writes"] > failed0:
                raise KvdError(f"kvd writes failed: {s['last_error']}")
            if time.monotonic() > deadline:
                raise KvdError(f"kvd writes did not land within {WRITE_WAIT_S:.0f} s: {s['last_error']}")
            time.sleep(0.005)
        put_s = time.perf_counter() - t0
        # writes the store refused for now (full): the daemon retried them, the round paid for it
        postponed = s["backpressure"] - postponed0
        hits0 = _long(b)["hits"]
        t0 = time.perf_counter()
        for i in range(0, count, batch):
            leases = b.lease(keys[i : i + batch])
            if any(x is None for x in leases):
                raise KvdError(f"kvd GET missed chunks that are in Mooncake: {_long(b)}")
            b.release([x[0] for x in leases if x is not None])
        get_s = time.perf_counter() - t0
        if _long(b)["hits"] - hits0 != count:
            raise KvdError("kvd GET did not read every chunk from Mooncake")
        a.delete(keys)  # also removes them from Mooncake
        b.delete(keys)
    return {"put_s": put_s, "get_s": get_s, "postponed": postponed}


def run_l4_bench(
    chunk_size: str = "4M",
    count: int = 32,
    rounds: int = 5,
    batch: int = 8,
    master: str | None = None,
    metadata: str | None = None,
    json_out: bool = False,
) -> int:
    size = size_at_least(chunk_size, "--chunk-size")
    at_least(count, "--count")
    at_least(rounds, "--rounds")
    at_least(batch, "--batch")
    total = size * count
    arena = f"{max(2 * total + (64 << 20), 256 << 20) >> 20}M"
    segment = f"{max(4 * total, 256 << 20) >> 20} MB"
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    mc: list[dict[str, float]] = []
    kv: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        cluster = None
        if master is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvd-bench-mc-")))
            cluster = stack.enter_context(mooncake_cluster(work, segment))
            master, metadata = cluster.address, cluster.metadata
        else:
            _check_master(master)
        meta = metadata or "P2PHANDSHAKE"
        args = ["--max-bytes", arena, "--long-backend", "mooncake", "--mooncake-master", master]
        args += ["--mooncake-metadata", meta]
        a_sock, _ = stack.enter_context(temp_daemon(*args))
        b_sock, _ = stack.enter_context(temp_daemon(*args))
        try:
            warm = through_kvd(a_sock, b_sock, size, count, batch, "warm")  # fault in both arenas, untimed
            for r in range(rounds):
                mc.append(mooncake_alone(master, meta, size, count, f"r{r}"))
                kv.append(through_kvd(a_sock, b_sock, size, count, batch, f"r{r}"))
        except KvdError as exc:
            if cluster is not None:  # what the throwaway store looked like when it refused
                exc.hint = f"the store: {cluster.describe()}"
            raise
    mib = total / (1 << 20)

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    result: dict[str, Any] = {
        "chunk_bytes": size,
        "chunks": count,
        "rounds": rounds,
        "get_batch": batch,
        "threads": THREADS,
        "postponed_writes": sum(int(k["postponed"]) for k in (warm, *kv)),
        "machine": machine_line(),
    }
    for op in ("put", "get"):
        result[f"mooncake_{op}_mib_s"] = med([mib / r[f"{op}_s_plain"] for r in mc])
        result[f"mooncake_multi_{op}_mib_s"] = med([mib / r[f"{op}_s_multi"] for r in mc])
        result[f"kvd_{op}_mib_s"] = med([mib / r[f"{op}_s"] for r in kv])
        # each round pairs the two sides back to back, so load from elsewhere hits both alike
        result[f"{op}_ratio"] = med([m[f"{op}_s_plain"] / k[f"{op}_s"] for m, k in zip(mc, kv, strict=True)])
        result[f"{op}_ratio_rounds"] = [
            round(m[f"{op}_s_plain"] / k[f"{op}_s"], 3) for m, k in zip(mc, kv, strict=True)
        ]
    if json_out:
        print(json.dumps(result))
        return 0
    print(f"kvd bench l4: {count} x {format_size(size)} chunks, {rounds} rounds (medians), {THREADS} threads")
    print(f"  {result['machine']}")
    print(f"  {'':<6}{'Mooncake alone':>18}{'through kvd':>16}{'ratio':>9}   (scatter/gather calls alone)")
    for op in ("put", "get"):
        print(
            f"  {op:<6}{result[f'mooncake_{op}_mib_s']:>12.1f} MiB/s{result[f'kvd_{op}_mib_s']:>11.1f} MiB/s"
            f"{result[f'{op}_ratio']:>9.2f}   ({result[f'mooncake_multi_{op}_mib_s']:.1f} MiB/s)"
        )
    print("  ratio = Mooncake time / kvd time per round, median; target >= 0.9 (kvd adds little)")
    if result["postponed_writes"]:
        print(
            f"  {result['postponed_writes']} writes were refused by the store for now (full) and retried"
            " by the daemon: a timed round with one includes the wait"
        )
    return 0


__all__ = ["run_l4_bench"]
