"""``kvd bench scale``, the host parts: restart with many chunk files on disk, and what the daemon's
CPU costs when idle and under sparse traffic (the busy-poll window).

Restart reuses ``kvd bench disk``'s pieces: chunk files are planted straight into a disk tier
(:func:`infera.bench.disk.plant_chunk_files`), the tree grows from one count to the next, and each
count gets two fresh daemons one after the other (:func:`infera.bench.disk.start_times`): the first
finds no index snapshot and scans every file (a first start, or one after a crash); it stops
cleanly, and the second adopts the snapshot that stop wrote (a clean restart).
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
from infera.kvd.tiers.diskindex import INDEX_FILE

RESTART_PAYLOAD = b"p" * 64


def restart_points(root: str, counts: Sequence[int], note: Callable[[str], None]) -> list[dict[str, Any]]:
    """For each count (ascending): plant files up to it, then time a start that scans them and a
    clean restart that adopts the snapshot of the first one's stop."""
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
        with contextlib.suppress(FileNotFoundError):  # the previous count's: the tree grew since
            os.unlink(os.path.join(tier, INDEX_FILE))
        os.sync()  # the writeback of the new files settles before the start is timed
        note(f"restart: daemon start on {n:,} files, no index snapshot (scan)")
        scan = start_times(tier, n)
        note(f"restart: clean restart on {n:,} files (index snapshot)")
        res = start_times(tier, n)
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
