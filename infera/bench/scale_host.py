"""``kvd bench scale``, the host parts: restart with many chunk files on disk, and what the daemon's
CPU costs when idle and under sparse traffic (the busy-poll window).

Restart reuses ``kvd bench disk``'s pieces: chunk files are planted straight into a disk tier
(:func:`infera.bench.disk.plant_chunk_files`), the tree grows from one count to the next, and each
count gets three daemons one after the other: the first (:func:`infera.bench.disk.start_times`)
finds no index checkpoint and scans every file (a first start, or a crash that left no usable
journal); it stops cleanly, and the second adopts the checkpoint that stop wrote (a clean restart).
The third (:func:`crash_times`) writes ``CRASH_PUTS`` more chunks, is killed with -9 and started
again: checkpoint + journal replayed, then the reconcile lists the tree (a restart after a crash).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from infera.bench.common import temp_daemon
from infera.bench.disk import NS as DISK_NS
from infera.bench.disk import plant_chunk_files, start_times
from infera.bench.procfs import cpu_seconds
from infera.errors import KvdError
from infera.kvd.process import DaemonProcess, wait_until
from infera.kvd.tiers.diskindex import INDEX_FILE
from infera.kvd.tiers.diskjournal import JOURNAL_FILE, NEXT_FILE

RESTART_PAYLOAD = b"p" * 64
CRASH_PUTS = 1000  # chunks written (and journaled) before the kill -9
WAIT_S = 900.0
POLL_S = 0.005


def _long_when(c: Any, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The long tier's stats once ``pred`` holds for them (polled every ``POLL_S``)."""

    def check() -> dict[str, Any] | None:
        s: dict[str, Any] = c.stats()["tiers"]["long"]
        return s if pred(s) else None

    found = wait_until(check, WAIT_S, what, POLL_S)
    assert found is not None
    return found


def crash_times(long_path: str, files: int) -> dict[str, Any]:
    """A daemon on ``files`` chunk files writes ``CRASH_PUTS`` more, is killed with -9 and started
    again: seconds from that start to its first answer (``serving_s``), to a loaded index
    (``loaded_s``: state no longer ``loading``; ``index_source``), and to the reconcile's end
    (``reconciled_s``), with the tier's ``index_load_s`` and ``reconcile_s``. It deletes the chunks
    it wrote and stops cleanly."""
    from infera.kvd.client import KvdClient

    args = ("--max-bytes", "64M", "--long-path", long_path, "--long-bytes", "1T")
    d = DaemonProcess(None, args, log_level="warning", label="the benchmark daemon", tmp_prefix="kvd-bench-")
    try:
        d.start()
        with KvdClient(d.socket, namespace=DISK_NS, name="kvd-bench") as c:
            wait_until(lambda: c.stats()["tiers"]["long"]["state"] != "loading", WAIT_S, "index load")
            wait_until(lambda: os.path.exists(os.path.join(long_path, JOURNAL_FILE)), 60, "the journal")
            for i in range(CRASH_PUTS):
                c.put(b"crash-%d" % i, RESTART_PAYLOAD, retention="long")
            total = files + CRASH_PUTS
            wait_until(
                lambda: (s := c.stats()["tiers"]["long"])["queued_writes"] == 0 and s["chunks"] >= total,
                60,
                "writes",
            )
        d.kill()
        out: dict[str, Any] = {"files": total}
        t = time.perf_counter()
        d.start(60)
        out["serving_s"] = time.perf_counter() - t
        with KvdClient(d.socket, namespace=DISK_NS, name="kvd-bench") as c:
            _long_when(c, lambda s: s["state"] != "loading", "index load")
            out["loaded_s"] = time.perf_counter() - t
            st = _long_when(c, lambda s: s["reconcile"] in ("finished", "failed", None), "reconcile")
            out["reconciled_s"] = time.perf_counter() - t
            out.update({k: st.get(k) for k in ("index_source", "index_load_s", "reconcile", "reconcile_s")})
            out.update({k: st.get(k) for k in ("reconcile_added", "reconcile_dropped", "index_detail")})
            if st["chunks"] != total:
                raise KvdError(
                    f"benchmark: indexed {st['chunks']} chunk files after kill -9, expected {total}"
                )
            for i in range(0, CRASH_PUTS, 97):
                if c.get(b"crash-%d" % i) != RESTART_PAYLOAD:
                    raise KvdError("benchmark: a chunk written before kill -9 did not come back")
            c.delete([b"crash-%d" % i for i in range(CRASH_PUTS)])  # the tree is back at ``files``
            wait_until(lambda: c.stats()["tiers"]["long"]["chunks"] == files, 60, "deletes")
    finally:
        d.close()
    return out


def restart_points(root: str, counts: Sequence[int], note: Callable[[str], None]) -> list[dict[str, Any]]:
    """For each count (ascending): plant files up to it, then time a start that scans them, a
    clean restart that adopts the snapshot of the first one's stop, and a restart after kill -9."""
    out: list[dict[str, Any]] = []
    planted = 0
    empty = start_times(os.path.join(root, "empty"), 0)
    tier = os.path.join(root, "tier")
    for n in counts:
        note(f"restart: planting chunk files {planted:,} -> {n:,}")
        t = time.perf_counter()
        plant_chunk_files(tier, DISK_NS, n - planted, RESTART_PAYLOAD, start=planted)
        gen_s = time.perf_counter() - t
        planted = n
        for name in (INDEX_FILE, JOURNAL_FILE, NEXT_FILE):  # the previous count's: the tree grew since
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(tier, name))
        os.sync()  # the writeback of the new files settles before the start is timed
        note(f"restart: daemon start on {n:,} files, no index snapshot (scan)")
        scan = start_times(tier, n)
        note(f"restart: clean restart on {n:,} files (index snapshot)")
        res = start_times(tier, n)
        note(f"restart: restart after kill -9 on {n:,} files (checkpoint + journal, then reconcile)")
        crash = crash_times(tier, n)
        out.append(
            {
                "files": n,
                "serving_s": res["serving_s"],
                "loaded_s": res["loaded_s"],
                "index_load_s": res["index_load_s"],
                "index_source": res["index_source"],
                "scan_serving_s": scan["serving_s"],
                "scan_loaded_s": scan["loaded_s"],
                "scan_index_source": scan["index_source"],
                "rss_anon_bytes": res["rss_anon_bytes"],
                "rss_over_empty_per_file": (res["rss_anon_bytes"] - empty["rss_anon_bytes"]) / n,
                "empty_serving_s": empty["serving_s"],
                "plant_s": gen_s,
                "crash": crash,
            }
        )
    return out


def _pace(c: Any, gap_s: float, seconds: float) -> int:
    """PING every ``gap_s`` for ``seconds``: sleep most of each gap, spin the last 200 us so the
    gap is exact (a bare sleep overshoots by 50 to 100 us here, enough to cross a 1 ms window)."""
    n = 0
    start = time.perf_counter()
    nxt = start
    end = start + seconds
    while nxt < end:
        c.ping()
        n += 1
        nxt += gap_s
        rest = nxt - time.perf_counter() - 200e-6
        if rest > 0:
            time.sleep(rest)
        while time.perf_counter() < nxt:
            pass
    return n


def cpu_points(idle_s: float, traffic_s: float, gaps_us: Sequence[int]) -> dict[str, Any]:
    """Daemon CPU (percent of one core) idle, and with one PING every gap, for the default poll
    window and with ``--busy-poll-us 0``."""
    from infera.kvd.client import KvdClient

    out: dict[str, Any] = {"idle_s": idle_s, "traffic_s": traffic_s, "windows": {}}
    for label, extra in (("default", ()), ("no_poll", ("--busy-poll-us", "0"))):
        rows: dict[str, Any] = {}
        with (
            temp_daemon("--max-bytes", "64M", *extra) as (sock, proc),
            KvdClient(sock, namespace="bench-scale-cpu", name="kvd-bench-cpu") as c,
        ):
            c.ping()
            time.sleep(min(1.0, idle_s))  # past the last poll window and the start's own work
            t, cpu = time.perf_counter(), cpu_seconds(proc.pid)
            time.sleep(idle_s)
            rows["idle"] = {"cpu_pct": (cpu_seconds(proc.pid) - cpu) / (time.perf_counter() - t) * 100}
            for gap in gaps_us:
                t, cpu = time.perf_counter(), cpu_seconds(proc.pid)
                n = _pace(c, gap / 1e6, traffic_s)
                dt, dcpu = time.perf_counter() - t, cpu_seconds(proc.pid) - cpu
                rows[str(gap)] = {
                    "gap_us": gap,
                    "requests_per_s": n / dt,
                    "cpu_pct": dcpu / dt * 100,
                    "cpu_us_per_request": dcpu / n * 1e6,
                }
        out["windows"][label] = rows
    return out


__all__ = ["cpu_points", "restart_points"]
