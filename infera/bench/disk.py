"""``kvd bench disk``: the disk long tier (L3) through real daemons, against raw file I/O.

Figures, all measured in one run on one filesystem (``--path``); each throughput is the best of
three rounds, the two sides alternating, so a noisy neighbour hurts neither side alone:

* write throughput of ``long`` chunks (default 4 MiB): from the first PUT until the daemon says
  every chunk file is written (same ``--fsync`` policy), versus writing the same bytes
  sequentially into one file with plain ``write`` calls and one ``fdatasync`` at the end;
* cold read throughput: a restarted daemon reading every chunk back from disk into its arena
  (checksum verified) for GETs of 8 keys, versus reading the raw file sequentially into a buffer;
  both with the page cache of those files dropped first (``posix_fadvise(DONTNEED)``). As in
  ``kvd bench arena``, the arena's pages are touched once before measuring (a running daemon's
  are); the figure for a just-started daemon, which also pays those first-touch faults, is
  printed too;
* with ``--files`` chunk files on disk (default 100,000, small payloads): the time from starting
  the daemon to its first answer, and to a fully loaded index, next to the start time of a
  daemon with an empty long tier.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

from infera.bench.args import at_least, one_of, size_at_least
from infera.bench.common import machine_line, ratio_table, temp_daemon
from infera.errors import KvdError
from infera.kvd import envvars
from infera.kvd.flags.parse import MIN_ARENA
from infera.kvd.process import wait_until
from infera.units import format_size

NS = "bench-disk"
READ_BATCH = 8
ROUNDS = 3
POLL_S = 0.005  # a wait inside a timed section ends within 5 ms of what it waits for
INDEX_WAIT_S = 900  # a scan of a million files on a loaded 2-core machine can take minutes


def _drop_cache(path: str) -> None:
    """Push the files' pages to disk and drop them from the page cache (no global drop_caches)."""
    paths = (
        [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _s, fs in os.walk(path) for f in fs]
    )
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _raw_write(path: str, payloads: list[bytes], chunks: int, sync: str) -> float:
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(chunks):
            view = memoryview(payloads[i % len(payloads)])
            while view.nbytes:
                view = view[os.write(fd, view) :]
        if sync != "none":
            os.fdatasync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def _raw_read(path: str, size: int) -> float:
    buf = bytearray(size)
    view = memoryview(buf)
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.readv(fd, [view]) > 0:
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - t


def _raw_files_read(root: str, threads: int) -> float:
    """Plain reads of the tier's own chunk files, ``threads`` at a time: what the filesystem gives
    a file-per-chunk layout with no daemon, no O_DIRECT and no checksum (a second baseline)."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [os.path.join(d, f) for d, _s, fs in os.walk(root) for f in fs if f.endswith(".kvcache")]

    def one(p: str) -> None:
        fd = os.open(p, os.O_RDONLY)
        try:
            buf = bytearray(os.fstat(fd).st_size)
            view = memoryview(buf)
            while view.nbytes and (n := os.readv(fd, [view])) > 0:
                view = view[n:]
        finally:
            os.close(fd)

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, paths))
    return time.perf_counter() - t


def _warm_arena(c: Any, arena: int, size: int) -> None:
    """Touch every arena page once (short chunks, then deleted), as a running daemon has."""
    filler = b"w" * size
    keys = [f"warm-{i}".encode() for i in range(arena // size)]
    for k in keys:
        c.put(k, filler, retention="short")
    c.delete(keys)


def _tier_write(
    sock: str, keys: list[bytes], payloads: list[bytes], arena: int
) -> tuple[float, dict[str, Any]]:
    from infera.kvd.client import KvdClient

    with KvdClient(sock, namespace=NS, name="kvd-bench") as c:
        _warm_arena(c, arena, len(payloads[0]))
        t = time.perf_counter()
        for i, key in enumerate(keys):
            c.put(key, payloads[i % len(payloads)])
        st = wait_until(
            lambda: (
                (s := c.stats()["tiers"]["long"])["queued_writes"] == 0
                and s["files_written"] + s["failed_writes"] + s["dropped_writes"] >= len(keys)
                and s
            ),
            600,
            "the chunk files to be written",
            POLL_S,
        )
        dt = time.perf_counter() - t
    if st["files_written"] != len(keys):
        raise KvdError(
            f"benchmark: only {st['files_written']} of {len(keys)} chunks reached disk "
            f"(dropped {st['dropped_writes']}, failed {st['failed_writes']}: {st['last_error']})"
        )
    return dt, st


def _tier_read(sock: str, keys: list[bytes], size: int, warm_arena: int) -> float:
    from infera.kvd.client import KvdClient

    with KvdClient(sock, namespace=NS, name="kvd-bench") as c:
        wait_until(lambda: c.stats()["tiers"]["long"]["state"] != "loading", 60, "the index to load", POLL_S)
        if warm_arena:
            _warm_arena(c, warm_arena, size)
        t = time.perf_counter()
        for i in range(0, len(keys), READ_BATCH):
            items = c.lease(keys[i : i + READ_BATCH])
            if any(item is None or item[2] != size for item in items):
                raise KvdError("benchmark: a chunk written to disk did not come back")
            c.release([item[0] for item in items if item is not None])
        dt = time.perf_counter() - t
        st = c.stats()["tiers"]["long"]
    if st["hits"] != len(keys) or st["corrupt_chunks"]:
        raise KvdError(f"benchmark: expected {len(keys)} disk hits, got {st['hits']}")
    return dt


def plant_chunk_files(root: str, namespace: str, count: int, payload: bytes, start: int = 0) -> list[bytes]:
    """Write ``count`` chunk files of ``payload`` straight into a disk tier at ``root``, laid out and
    framed as the daemon writes them (keys: ``start``, ``start + 1``, ... as 16 big-endian bytes),
    with no daemon and no fsync; returns the keys."""
    from infera.kvd import chunkfile as cf

    digest = cf.ns_digest(namespace)
    header = cf.make_header(namespace, b"k", payload)
    made: set[str] = set()
    keys = [i.to_bytes(16, "big") for i in range(start, start + count)]
    for key in keys:
        header.key = key
        path = os.path.join(root, cf.relpath(digest, key))
        d = os.path.dirname(path)
        if d not in made:
            cf.ensure_dir(root, digest, key, namespace)
            made.add(d)
        cf.write_file(path, header.pack(), payload, sync="none")
    return keys


def _generate(root: str, files: int) -> float:
    t = time.perf_counter()
    plant_chunk_files(root, NS, files, b"p" * 64)
    return time.perf_counter() - t


def start_times(long_path: str, files: int) -> dict[str, Any]:
    """Start a daemon on a disk tier holding ``files`` chunk files (planted in namespace NS): the
    seconds to its first answer (``serving_s``) and to a loaded index (``loaded_s``; the tier's own
    ``index_load_s``), how the index was loaded (``index_source``: snapshot or scan), and its
    anonymous resident memory once loaded (``rss_anon_bytes``). The daemon stops cleanly, so it
    leaves an index snapshot for the next start."""
    from infera.bench.procfs import rss_anon_bytes
    from infera.kvd.client import KvdClient

    out: dict[str, Any] = {}
    t = time.perf_counter()
    with temp_daemon("--max-bytes", "64M", "--long-path", long_path, "--long-bytes", "1T") as (sock, proc):
        out["serving_s"] = time.perf_counter() - t
        with KvdClient(sock, namespace=NS, name="kvd-bench") as c:
            if files:
                probe = [(files - 1).to_bytes(16, "big")]
                out["lookup_while_loading"] = float(c.lookup(probe))
            st = wait_until(
                lambda: (s := c.stats()["tiers"]["long"])["state"] != "loading" and s,
                INDEX_WAIT_S,
                "index load",
                POLL_S,
            )
            out["loaded_s"] = time.perf_counter() - t
            out["index_load_s"] = st["index_load_s"]
            out["index_source"] = st.get("index_source")
            if st["chunks"] != files:
                raise KvdError(f"benchmark: indexed {st['chunks']} chunk files, expected {files}")
            out["rss_anon_bytes"] = rss_anon_bytes(proc.pid)
    return out


def run_disk_bench(
    path: str | None, chunks: int, chunk_size: str, files: int, fsync: str, json_out: bool
) -> int:
    size = size_at_least(chunk_size, "--chunk-size")
    at_least(chunks, "--chunks")
    at_least(files, "--files", 0)
    one_of(fsync, "--fsync", ("none", "data", "always"))
    envvars.check("disk")  # the daemon's own INFERA_KVD_DISK_* settings, before anything starts
    parent = path or os.environ.get("TMPDIR") or "/var/tmp"
    try:
        base = tempfile.mkdtemp(prefix="kvd-bench-disk-", dir=parent)
    except OSError as exc:
        raise KvdError(f"cannot create a work directory in {parent}: {exc.strerror}") from None
    total = size * chunks
    need = total * 2 + files * 8192
    free = shutil.disk_usage(base).free
    if free < need:
        shutil.rmtree(base, ignore_errors=True)
        raise KvdError(
            f"{parent} has {format_size(free)} free; this run needs about {format_size(need)}",
            hint="use --path on a larger filesystem, or fewer --chunks / --files",
        )
    res: dict[str, Any] = {
        "machine": machine_line(),
        "path": parent,
        "chunk_bytes": size,
        "chunks": chunks,
        "fsync": fsync,
    }
    try:
        tier = os.path.join(base, "tier")
        raw = os.path.join(base, "raw.bin")
        payloads = [os.urandom(size) for _ in range(min(chunks, 8))]
        keys = [f"chunk-{i}".encode() for i in range(chunks)]
        arena = total + (64 << 20)
        daemon_args = ["--max-bytes", str(arena), "--long-path", tier]
        # room for the chunks twice over, and never below the long tier's own minimum
        daemon_args += ["--long-bytes", str(max(total * 2, MIN_ARENA)), "--fsync", fsync]

        # best of ROUNDS for each side, alternating, since shared machines are noisy
        raw_w, tier_w = [], []
        for _ in range(ROUNDS):
            raw_w.append(_raw_write(raw, payloads, chunks, fsync))
            shutil.rmtree(tier, ignore_errors=True)
            with temp_daemon(*daemon_args) as (sock, _proc):
                tier_w.append(_tier_write(sock, keys, payloads, arena)[0])
        res["raw_write_gbps"] = total / min(raw_w) / 1e9
        res["tier_write_gbps"] = total / min(tier_w) / 1e9
        res["write_ratio"] = res["tier_write_gbps"] / res["raw_write_gbps"]

        # a freshly started daemon: cold files and an arena whose pages were never touched
        _drop_cache(tier)
        with temp_daemon(*daemon_args) as (sock, _proc):
            res["tier_read_fresh_arena_gbps"] = total / _tier_read(sock, keys, size, 0) / 1e9
        # the main figure: cold files, arena pages touched once
        raw_r, tier_r, files_r = [], [], []
        readers = int(envvars.get("INFERA_KVD_DISK_READERS", 0)) or 4
        for _ in range(ROUNDS):
            _drop_cache(raw)
            raw_r.append(_raw_read(raw, size))
            _drop_cache(tier)
            files_r.append(_raw_files_read(tier, readers))
            _drop_cache(tier)
            with temp_daemon(*daemon_args) as (sock, _proc):
                tier_r.append(_tier_read(sock, keys, size, arena))
        res["raw_read_gbps"] = total / min(raw_r) / 1e9
        res["raw_files_read_gbps"] = total / min(files_r) / 1e9
        res["tier_read_gbps"] = total / min(tier_r) / 1e9
        res["read_ratio"] = res["tier_read_gbps"] / res["raw_read_gbps"]
        res["read_ratio_files"] = res["tier_read_gbps"] / res["raw_files_read_gbps"]
        shutil.rmtree(tier, ignore_errors=True)
        os.unlink(raw)

        if files:
            many = os.path.join(base, "many")
            empty = os.path.join(base, "empty")
            res["files"] = files
            res["generate_s"] = _generate(many, files)
            os.sync()  # let the writeback of the new files settle before timing the starts
            res["start_empty"] = start_times(empty, 0)
            res["start_with_files"] = start_times(many, files)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if json_out:
        print(json.dumps(res, indent=2))
        return 0
    _print_table(res)
    return 0


def _print_table(res: dict[str, Any]) -> None:
    from rich.console import Console

    size = format_size(res["chunk_bytes"])
    t = ratio_table(f"kvd bench disk · {res['machine']} · {res['path']} · fsync={res['fsync']}", "disk tier")
    t.add_row(
        f"write {res['chunks']} x {size} long chunks (GB/s)",
        f"{res['tier_write_gbps']:.2f}",
        f"{res['raw_write_gbps']:.2f} raw sequential",
        f"{res['write_ratio']:.2f} (>= 0.80)",
    )
    t.add_row(
        f"cold read {res['chunks']} x {size}, GETs of {READ_BATCH} (GB/s)",
        f"{res['tier_read_gbps']:.2f}",
        f"{res['raw_read_gbps']:.2f} raw sequential",
        f"{res['read_ratio']:.2f} (>= 0.80)",
    )
    t.add_row(
        "  same files read raw, one file per chunk, no daemon",
        "",
        f"{res['raw_files_read_gbps']:.2f} raw per-file",
        f"{res['read_ratio_files']:.2f}",
    )
    t.add_row(
        "  same, just-started daemon (arena pages never touched)",
        f"{res['tier_read_fresh_arena_gbps']:.2f}",
        "",
        f"{res['tier_read_fresh_arena_gbps'] / res['raw_read_gbps']:.2f}",
    )
    if "files" in res:
        w, e = res["start_with_files"], res["start_empty"]
        t.add_row(
            f"start to serving, {res['files']:,} chunk files",
            f"{w['serving_s']:.2f} s",
            f"{e['serving_s']:.2f} s empty tier",
            "<= 2 s",
        )
        t.add_row(
            f"start to loaded index, {res['files']:,} files",
            f"{w['loaded_s']:.2f} s (scan {w['index_load_s']:.2f} s)",
            f"{e['loaded_s']:.2f} s empty tier",
            "",
        )
    Console().print(t)


__all__ = ["NS", "plant_chunk_files", "run_disk_bench", "start_times"]
