"""The store-throughput and restart-to-warm parts of ``kvd bench compare``.

Each peer's server runs as its own process on loopback (``infera.bench.services``) and each
client in a fresh Python process, so no peer inherits another's state. A peer that cannot run
here is recorded with its exact error, never dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from infera.bench.disk import plant_chunk_files
from infera.bench.services import (
    REPO,
    LMCacheServer,
    Redis,
    ServiceMissing,
    mooncake_cluster,
    running,
)
from infera.errors import KvdError

STORE_PEERS = ("kvd", "mooncake", "lmcache_server", "redis")
NS = "bench-compare"


class Tracker(Protocol):
    """The progress display: ``note`` says what is going on, ``step`` also counts one step done."""

    def note(self, text: str) -> None: ...
    def step(self, text: str) -> None: ...


def _tail(text: str, n: int = 600) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-4:])[-n:]


def run_worker(module: str, *args: str, python: str | None = None, timeout: float = 900) -> dict[str, Any]:
    """``python -m MODULE ARGS``; its ``RESULT {json}`` line, or a KvdError with its last words."""
    proc = subprocess.run(
        [python or sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO) if (REPO / "infera").is_dir() else None,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise KvdError(f"exit {proc.returncode}: {_tail(proc.stderr or proc.stdout)}")
    out: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return out


@contextlib.contextmanager
def _store_server(peer: str, work: Path, size: int, count: int, rounds: int) -> Iterator[dict[str, Any]]:
    total = size * count * (rounds + 2)
    if peer == "kvd":
        from infera.bench.common import temp_daemon

        with temp_daemon("--max-bytes", str(2 * size * count + (64 << 20))) as (sock, _proc):
            yield {"socket": sock}
    elif peer == "mooncake":
        with mooncake_cluster(work, f"{max(total, 256 << 20) >> 20} MB") as master:
            yield {"master": master.address, "metadata": master.metadata}
    elif peer == "lmcache_server":
        lmc = LMCacheServer(work)
        with running(lmc):
            yield {"port": lmc.port}
    elif peer == "redis":
        rds = Redis(work, maxmemory=f"{max(total, 256 << 20) >> 20}mb")
        with running(rds):
            yield {"port": rds.port}
    else:
        raise KvdError(f"unknown store peer {peer!r}")


def run_store(
    work: Path, size: int, count: int, rounds: int, peers: tuple[str, ...], tracker: Tracker
) -> dict[str, Any]:
    from infera.bench.compare_store import memcpy_gbps

    tracker.step("store: memcpy")
    rows: dict[str, Any] = {"memcpy": memcpy_gbps(size, count, rounds)}
    for peer in peers:
        tracker.step(f"store: {peer}")
        d = work / f"store-{peer}"
        d.mkdir(parents=True, exist_ok=True)
        try:
            with _store_server(peer, d, size, count, rounds) as args:
                args.update(size=size, count=count, rounds=rounds)
                rows[peer] = run_worker("infera.bench.compare_store", peer, json.dumps(args))
        except (KvdError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            rows[peer] = {"error": str(exc).strip().splitlines()[0][:500] if str(exc).strip() else repr(exc)}
        shutil.rmtree(d, ignore_errors=True)
    return {"chunk_bytes": size, "chunks": count, "rounds": rounds, "rows": rows}


# -- restart to warm -----------------------------------------------------------------------------


def _kvd_restart(work: Path, count: int, size: int) -> dict[str, Any]:
    """Seconds from spawning the daemon to the first GET that returns a chunk from disk, and to
    the loaded index."""
    from infera.kvd.client import KvdClient, KvdClientError
    from infera.kvd.process import DaemonProcess

    root = work / "kvd-tier"
    keys = plant_chunk_files(str(root), NS, count, os.urandom(size))
    os.sync()
    sock = str(work / "kvd.sock")
    args = ["--max-bytes", "256M", "--long-path", str(root), "--long-bytes", "1T"]
    daemon = DaemonProcess(sock, args, work / "kvd.log", log_level="warning", label="the kvd daemon")
    t0 = time.perf_counter()
    daemon.spawn()  # timed from the spawn to the first hit, so not start(): it waits for PING
    try:
        first = ready = None
        deadline = time.monotonic() + 120
        while first is None:
            if not daemon.alive() or time.monotonic() > deadline:
                raise KvdError("kvd daemon did not serve: " + _tail(daemon.log()))
            try:
                with KvdClient(sock, namespace=NS, name="bench-restart", timeout=5) as c:
                    got = c.get(keys[-1])
                    if got is not None and len(got) == size:
                        first = time.perf_counter() - t0
                        while c.stats()["tiers"]["long"]["state"] == "loading":
                            if time.monotonic() > deadline:
                                raise KvdError("kvd index did not load in 120 s")
                            time.sleep(0.005)
                        ready = time.perf_counter() - t0
            except KvdClientError:
                time.sleep(0.002)
    finally:
        daemon.stop(timeout=15)
    shutil.rmtree(root, ignore_errors=True)
    return {"first_hit_s": first, "ready_s": ready}


def _redis_restart(work: Path, count: int, size: int) -> dict[str, Any]:
    """Redis with an RDB snapshot (``SAVE``): it loads the whole file before it answers a GET."""
    srv = Redis(work, maxmemory=f"{max(2 * count * size, 256 << 20) >> 20}mb")
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as s:
            payload = os.urandom(size)
            batch = bytearray()
            for i in range(count):
                key = b"k%d" % i
                batch += (
                    b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, size) + payload + b"\r\n"
                )
                if len(batch) > (8 << 20) or i == count - 1:
                    s.sendall(batch)
                    batch.clear()
            s.sendall(b"SAVE\r\n")
            got = b""
            while got.count(b"\r\n") < count + 1:
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise KvdError("redis closed the connection while loading the benchmark data")
                got += chunk
            if not got.endswith(b"+OK\r\n"):
                raise KvdError("redis SAVE failed: " + got[-200:].decode(errors="replace"))
        srv.stop()
        last = b"k%d" % (count - 1)
        t0 = time.perf_counter()
        proc = subprocess.Popen(srv.argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=work)
        srv.proc = proc
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise KvdError("redis did not come back: " + srv.log())
            try:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                    s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(last), last))
                    head = s.recv(64)
                    if head.startswith(b"$%d\r\n" % size):
                        break
            except OSError:
                pass
            time.sleep(0.002)
        first = time.perf_counter() - t0
        rdb = (work / "dump.rdb").stat().st_size
    finally:
        srv.stop()
        with contextlib.suppress(OSError):
            (work / "dump.rdb").unlink()
    return {"first_hit_s": first, "ready_s": first, "rdb_bytes": rdb}


def lmcache_python() -> str | None:
    """A Python with lmcache: the benchmark venv (vLLM + LMCache) or the lmcache_server venv."""
    for venv in (".venv-bench", ".venv-lmcache"):
        py = REPO / venv / "bin" / "python"
        if py.exists():
            return str(py)
    return None


def _lmcache_restart(work: Path, backend: str, count: int, size: int) -> dict[str, Any]:
    py = lmcache_python()
    if py is None:
        raise ServiceMissing("no Python with lmcache: scripts/setup.sh --all creates .venv-lmcache")
    root = work / f"lmc-{backend}"
    root.mkdir(parents=True, exist_ok=True)
    mod = "infera.bench.compare_lmcache"
    wrote = run_worker(mod, "write", backend, str(root), str(count), str(size), python=py)
    os.sync()
    t0 = time.perf_counter()
    read = run_worker(mod, "read", backend, str(root), str(count), str(size), python=py)
    wall = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    return {
        "first_hit_s": read["first_hit_s"],
        "ready_s": read["first_hit_s"],
        "found_after_restart": read["found"],
        "files_on_disk": read["files_on_disk"],
        "stored": wrote["stored"],
        "import_s": read["import_s"],
        "process_s": wall,
    }


def _floor(work: Path, size: int) -> float:
    """A bare Python process that reads one chunk file: less than any store can do after a start."""
    path = work / "floor.bin"
    path.write_bytes(os.urandom(size))
    os.sync()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", f"open({str(path)!r}, 'rb').read()"], check=True)
        best = min(best, time.perf_counter() - t)
    path.unlink()
    return best


RESTART_PEERS = ("kvd", "redis", "lmcache_local_disk", "lmcache_fs")


def run_restart(work: Path, counts: list[int], size: int, tracker: Tracker) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {p: {} for p in RESTART_PEERS}
    tracker.step("restart: floor")
    floor = _floor(work, size)
    for n in counts:
        for peer in RESTART_PEERS:
            tracker.step(f"restart: {peer}, {n:,} chunks")
            d = work / f"restart-{peer}-{n}"
            d.mkdir(parents=True, exist_ok=True)
            try:
                if peer == "kvd":
                    res = _kvd_restart(d, n, size)
                elif peer == "redis":
                    res = _redis_restart(d, n, size)
                else:
                    res = _lmcache_restart(d, peer.removeprefix("lmcache_"), n, size)
            except (KvdError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                res = {"error": str(exc).strip().splitlines()[0][:500] if str(exc).strip() else repr(exc)}
            rows[peer][str(n)] = res
            shutil.rmtree(d, ignore_errors=True)
    return {"chunk_bytes": size, "counts": counts, "floor_s": floor, "rows": rows}


__all__ = [
    "RESTART_PEERS",
    "STORE_PEERS",
    "Tracker",
    "lmcache_python",
    "run_restart",
    "run_store",
    "run_worker",
]
