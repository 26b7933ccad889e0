"""The blocking half of the disk tier: worker threads and the index scan.

Nothing here touches the daemon's index or store: threads get plain job objects, do the file
I/O, and the tier hands results back to the loop thread with ``Server.call_soon``. Writes are
spread over lanes by key, so two writes (or a write and an unlink) of one key never race.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infera.kvd import chunkfile as cf

log = logging.getLogger("infera.kvd.disk")

QUARANTINE_MAX = 64  # corrupt files kept for inspection; beyond that they are deleted
STALE_TEMP_S = 60.0  # a temporary file this old belongs to a writer that died


class Workers:
    """``n`` daemon threads running ``fn(job)``; lane-per-thread (ordered) or one shared queue."""

    def __init__(self, name: str, n: int, fn: Callable[[Any], None], lanes: bool) -> None:
        self._fn = fn
        count = max(1, n)
        self.queues: list[queue.SimpleQueue[Any]] = [
            queue.SimpleQueue() for _ in range(count if lanes else 1)
        ]
        self.threads = []
        for i in range(count):
            q = self.queues[i if lanes else 0]
            t = threading.Thread(target=self._run, args=(q,), name=f"kvd-{name}-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, q: queue.SimpleQueue[Any]) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                self._fn(job)
            except Exception:  # a bug must cost one job, never the thread
                log.exception("disk tier worker failed on a job")

    def submit(self, job: Any, lane: int = 0) -> None:
        self.queues[lane % len(self.queues)].put(job)

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; returns False if a thread is still busy at the deadline."""
        for q in self.queues:
            for _ in range(len(self.threads) if len(self.queues) == 1 else 1):
                q.put(None)
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)


def file_path(root: str, fkey: bytes) -> str:
    """Path of the file of index key ``fkey`` (8-byte namespace digest prefix + chunk key)."""
    key = fkey[8:]
    return os.path.join(root, cf.VERSION_DIR, fkey[:8].hex(), cf.fan_dirname(key), cf.file_name(key))


def quarantine(root: str, path: str) -> str | None:
    """Move a corrupt file out of the tree (or delete it once the quarantine is full)."""
    qdir = os.path.join(root, cf.QUARANTINE_DIR)
    try:
        os.makedirs(qdir, exist_ok=True)
        if len(os.listdir(qdir)) >= QUARANTINE_MAX:
            os.unlink(path)
            return None
        rel = os.path.relpath(path, root).replace(os.sep, "-")
        target = os.path.join(qdir, f"{time.strftime('%Y%m%dT%H%M%S')}-{rel}")
        os.rename(path, target)
        return target
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot quarantine %s: %s", path, exc.strerror)
        return None


# -- the index scan at start ---------------------------------------------------------------
@dataclass
class ScanResult:
    entries: list[tuple[int, bytes, int]] = field(default_factory=list)  # (mtime_ns, fkey, size)
    other_version: int = 0
    quarantined: int = 0
    stale_temps: int = 0
    young_temps: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def _count_files(path: str) -> int:
    n = 0
    for dirpath, _dirs, files in os.walk(path):
        n += sum(1 for f in files if f.endswith(cf.EXT) and not f.startswith("."))
        del dirpath
    return n


def _sweep_temp(path: str, entry: os.DirEntry[str], now: float, out: ScanResult) -> None:
    try:
        age = now - entry.stat(follow_symlinks=False).st_mtime
        if age >= STALE_TEMP_S:
            os.unlink(path)
            out.stale_temps += 1
        else:
            out.young_temps.append(path)
    except OSError:
        pass


def scan(root: str, now: float | None = None) -> ScanResult:
    """Walk the tree once with ``scandir``: chunk files become index entries (no file is opened:
    headers are validated when a chunk is read), other format versions are counted, temporary
    files of dead writers are removed. Ordered oldest first by modification time."""
    now = time.time() if now is None else now
    out = ScanResult()
    try:
        top = list(os.scandir(root))
    except OSError as exc:
        out.unreadable.append(f"{root}: {exc.strerror}")
        return out
    for d in top:
        if not d.is_dir(follow_symlinks=False):
            continue
        if d.name == cf.QUARANTINE_DIR:
            out.quarantined = sum(1 for _ in os.scandir(d.path))
        elif d.name != cf.VERSION_DIR and d.name[:1] == "v" and d.name[1:].isdigit():
            out.other_version += _count_files(d.path)
    vroot = os.path.join(root, cf.VERSION_DIR)
    try:
        ns_dirs = [e for e in os.scandir(vroot) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        ns_dirs = []
    except OSError as exc:
        out.unreadable.append(f"{vroot}: {exc.strerror}")
        ns_dirs = []
    entries = out.entries
    for ns in ns_dirs:
        try:
            ns8 = bytes.fromhex(ns.name)
        except ValueError:
            continue
        if len(ns8) != 8:
            continue
        try:
            fans = [e for e in os.scandir(ns.path) if e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            out.unreadable.append(f"{ns.path}: {exc.strerror}")
            continue
        for fan in fans:
            try:
                it = os.scandir(fan.path)
            except OSError as exc:
                out.unreadable.append(f"{fan.path}: {exc.strerror}")
                continue
            with it:
                for e in it:
                    name = e.name
                    key = cf.key_from_name(name)
                    if key is None:
                        if cf.is_temp_name(name):
                            _sweep_temp(e.path, e, now, out)
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    entries.append((st.st_mtime_ns, ns8 + key, st.st_size))
    entries.sort()
    return out


def classify_os_error(exc: OSError) -> str:
    """A short, stable name for an I/O failure (used to log each condition once)."""
    return errno.errorcode.get(exc.errno or 0, "EIO") if exc.errno else "EIO"


__all__ = ["ScanResult", "Workers", "classify_os_error", "file_path", "quarantine", "scan"]
