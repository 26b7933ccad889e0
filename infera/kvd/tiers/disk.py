"""L3: the disk long tier. ``long`` chunks persist as checksummed files under ``--long-path``.

What only a disk has lives here: the file index, capacity with second-chance eviction, loading
it at start (:mod:`.diskload`), ADOPT of client-written files (:mod:`.diskadopt`), and the I/O hooks of the shared pipelines
(:mod:`.pipeline`: write-through and retries; :mod:`.promotions`: reads). File operations are in
:mod:`.diskfs`, :mod:`.diskscan` and :mod:`.diskread`. Beyond the pipelines' promises:

* A clean stop makes a last attempt at every ``long`` chunk in RAM not yet on disk, for at most
  ``INFERA_KVD_DISK_STOP_S`` (10 s).
* A file that fails verification when read is a miss, is counted and is moved to
  ``<long-path>/quarantine``.
* At start the index is the checkpoint with its journal replayed after a crash (then reconciled
  with the tree in the background: :mod:`.diskreconcile`), the checkpoint a clean stop wrote
  (:mod:`.diskindex`), or else rebuilt from the files: only regular files whose header checks out
  are indexed (:func:`diskscan.scan`). Until that is done the tier is ``loading``: LOOKUP and GET
  still find chunks on disk by checking the file the key maps to. No link under the root is
  followed. Every index change is journaled (:mod:`.diskcheckpoint`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from infera.kvd import chunkfile as cf
from infera.kvd import envvars
from infera.kvd.keyspace import Namespace, key_of
from infera.kvd.store import Chunk
from infera.kvd.tiers import diskfs, diskread, diskscan
from infera.kvd.tiers.diskadopt import AdoptMixin
from infera.kvd.tiers.diskcheckpoint import CheckpointMixin
from infera.kvd.tiers.diskload import LoadMixin
from infera.kvd.tiers.diskreconcile import ReconcileMixin
from infera.kvd.tiers.pipeline import WriteJob, WriteThrough
from infera.kvd.tiers.promotions import Promotions, ReadJob

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.tiers.base import FileBackedTier, TierHost

log = logging.getLogger("infera.kvd.disk")

READERS = 4
SECOND_CHANCES = 64  # files spared per eviction pass because their chunk is in RAM
STOP_BUDGET_S = 10.0  # a clean stop's last attempt at unwritten chunks (INFERA_KVD_DISK_STOP_S)


class DiskTier(AdoptMixin, LoadMixin, CheckpointMixin, ReconcileMixin):
    """The ``disk`` long tier (a :class:`~.base.FileBackedTier`)."""

    backend = "disk"
    label = "disk tier"
    log = log

    def __init__(self, cfg: DaemonConfig, host: TierHost) -> None:
        assert cfg.long_path is not None and cfg.long_bytes is not None
        self.host = host
        self.store = store = host.store
        self.root = os.path.abspath(cfg.long_path)
        self.capacity = cfg.long_bytes
        self.sync = cfg.fsync
        self.root_fd, self._lock_fd = diskfs.open_tree(self.root)
        self.index: OrderedDict[bytes, int] = OrderedDict()  # fkey -> file size, LRU first
        self.bytes_used = 0
        self.ns = store.ns  # the namespace table: id -> Namespace, fkey <-> ikey
        # condition -> when it was first seen (time.monotonic()); logged once until a recovery
        self._failing: dict[str, float] = {}
        self._deleted_while_loading: set[bytes] = set()
        self._young_temps: list[str] = []
        self._test_write_delay = envvars.get("INFERA_KVD_TEST_WRITE_DELAY_S", 0.0)  # a slow disk on demand
        self.loading = True
        self.index_load_s: float | None = None
        self.last_error: str | None = None
        self.c = dict.fromkeys(
            (
                *("hits", "misses", "bytes_read", "bytes_written", "files_written", "corrupt_chunks"),
                *("failed_writes", "failed_reads", "dropped_writes", "evicted_files", "evicted_unwritten"),
                *("prewarmed", "promotion_no_room", "files_other_version", "files_ignored", "quarantined"),
                *("stale_temp_removed", "write_retries", "recovered_writes"),
                *("reconcile_added", "reconcile_dropped", "checkpoints_written"),
            ),
            0,
        )
        writers = int(envvars.get("INFERA_KVD_DISK_WRITERS", cfg.long_writers))
        retry_s = envvars.get("INFERA_KVD_DISK_RETRY_S", 1.0)
        self.writes = WriteThrough(host, self, "disk-write", writers, cfg.long_write_queue, retry_s)
        self._files = diskread.FileReader(host.arena.view, self.root, self.root_fd)
        readers = int(envvars.get("INFERA_KVD_DISK_READERS", READERS))
        self.reads = Promotions(host, self, "disk-read", readers, deadline_s=None)
        self._init_journal()
        self._load_started = time.monotonic()
        # the scan starts once the loop runs, so it never delays the daemon's first answer
        host.call_soon(threading.Thread(target=self._load, name="kvd-disk-load", daemon=True).start)
        diskfs.check_space(self.root, self.capacity)

    # -- keys -------------------------------------------------------------------------------
    def _busy(self, fkey: bytes) -> tuple[bool, bool]:
        """(whether RAM holds or a read is fetching the chunk of ``fkey``, whether a write of it is
        queued)."""
        ikey = self.ns.ikey_of(fkey)
        if ikey is None:
            return False, False
        return ikey in self.store.index or ikey in self.reads.jobs, ikey in self.writes.jobs

    # -- capacity ---------------------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Bytes of queued writes, counted against capacity before they land."""
        return self.writes.pinned + self.writes.queued * cf.HEADER_SIZE

    def _make_room(self, need: int) -> None:
        """Evict least-recently-used files until ``need`` more bytes fit. A file whose chunk is
        still in RAM (or being read) gets one second chance, so a hot chunk keeps its copy."""
        index = self.index
        chances = min(len(index), SECOND_CHANCES)
        while self.bytes_used + self.reserved + need > self.capacity and index:
            fkey = next(iter(index))
            hot, writing = self._busy(fkey)
            if chances > 0 and hot:
                index.move_to_end(fkey)
                chances -= 1
                continue
            self.forget(fkey)
            if writing:
                continue  # a newer write of this chunk is queued: its rename replaces the file
            self.c["evicted_files"] += 1
            self._unlink(fkey)

    def forget(self, fkey: bytes) -> None:
        size = self.index.pop(fkey, None)
        if size is not None:
            self.bytes_used -= size
            self._note_removed(fkey)

    def _put(self, fkey: bytes, size: int) -> None:
        old = self.index.pop(fkey, None)
        self.bytes_used += size - (old or 0)
        self.index[fkey] = size
        self._note_landed(fkey, size)

    def _unlink(self, fkey: bytes) -> None:
        def unlink() -> None:  # on the writer lane of fkey, after its queued writes
            try:
                diskfs.unlink_chunk(self.root_fd, fkey)
            except OSError as exc:
                why = f"unlink {diskfs.file_path(self.root, fkey)}: {exc}"
                fail = functools.partial(self.fail, "unlink-" + diskfs.classify_os_error(exc), why)
                self.host.call_soon(fail)

        self.writes.after(fkey, unlink)

    # -- writes (the WriteThrough hooks) ------------------------------------------------------
    def address(self, chunk: Chunk, ns: Namespace) -> bytes | None:
        size = cf.HEADER_SIZE + chunk.length
        if size > self.capacity:
            self.fail("too_large", f"a {size}-byte chunk is larger than --long-bytes; not persisted")
            return None
        return ns.fkey(chunk.key)

    def accepting(self) -> bool:
        return True

    def admitted(self, job: WriteJob) -> None:
        self._make_room(0)  # the job's bytes are already reserved

    def write(self, job: WriteJob) -> OSError | None:
        """Writer thread: the chunk's bytes from the arena to its file."""
        if self._test_write_delay:
            time.sleep(self._test_write_delay)
        chunk, ns = job.chunk, job.ns
        view = self.host.arena.view[chunk.offset : chunk.offset + chunk.length]
        try:
            diskfs.write_chunk(self.root_fd, ns.digest, chunk.key, ns.text, view, self.sync)
        except OSError as exc:
            return exc
        finally:
            view.release()
        return None

    def landed(self, job: WriteJob) -> None:
        self._put(job.where, job.size)
        self.c["bytes_written"] += job.size
        self.c["files_written"] += 1
        self._recovered(job.started)
        self._make_room(0)

    def failed(self, job: WriteJob, err: Exception) -> None:
        self.c["failed_writes"] += 1
        where = diskfs.file_path(self.root, job.where)
        self.fail("write-" + diskfs.classify_os_error(err), f"writing {where}: {diskfs.describe(err)}")

    # -- errors -----------------------------------------------------------------------------
    def fail(self, condition: str, message: str) -> None:
        self.last_error = message
        if condition not in self._failing:
            self._failing[condition] = time.monotonic()
            log.error("disk tier: %s (further %s errors are counted, not logged)", message, condition)

    def _recovered(self, started: float) -> None:
        """A write that began at ``started`` succeeded: the write conditions first seen before it
        began are over (logged, so a relapse is logged again). A write that was already under way
        when a condition appeared says nothing about it: with several writer lanes, one that
        started before the disk filled may land after another failed."""
        write_conditions = [c for c, t in self._failing.items() if c.startswith("write-") and t < started]
        if write_conditions:
            log.warning("disk tier: writes succeed again after %s", ", ".join(write_conditions))
            for c in write_conditions:
                del self._failing[c]

    # -- reads (the Promotions hooks) ----------------------------------------------------------
    def contains_many(self, ikeys: list[bytes]) -> list[bool]:
        return [self.contains(k) for k in ikeys]

    def contains(self, ikey: bytes) -> bool:
        fkey = self.ns.fkey(ikey)
        if fkey in self.index:
            return True
        return self.loading and self.probe(fkey) is not None

    def probe(self, fkey: bytes) -> int | None:
        """While the index loads, check the file itself (its header, never through a link) and
        index it if it is a usable chunk file."""
        if fkey in self._deleted_while_loading:
            return None
        v = diskscan.check_chunk(self.root_fd, fkey)
        if v.kind != diskscan.OK:
            return None
        self._put(fkey, v.size)
        return v.size

    def locate(self, ikey: bytes, ns: Namespace) -> tuple[bytes, int] | None:
        fkey = ns.fkey(key_of(ikey))
        size = self.index.get(fkey)
        if size is None and self.loading:
            size = self.probe(fkey)
        if size is None or size < cf.HEADER_SIZE:
            return None
        return fkey, size - cf.HEADER_SIZE

    def start(self, job: ReadJob) -> tuple[str, Any]:
        return self._files.read(job)

    def promoted(self, job: ReadJob) -> None:
        if job.where in self.index:
            self.index.move_to_end(job.where)

    def read_failed(self, job: ReadJob, outcome: str, detail: Any) -> None:
        fkey = job.where
        if outcome in (diskread.MISSING, diskread.IGNORED, diskread.OTHER, diskread.CORRUPT):
            self.forget(fkey)
        if outcome == diskread.IGNORED:
            self.c["files_ignored"] += 1
        elif outcome == diskread.SIZE and fkey in self.index:
            self._put(fkey, detail)
        elif outcome == diskread.OTHER:
            self.c["files_other_version"] += 1
        elif outcome == diskread.CORRUPT:
            why, where = detail
            self.c["quarantined"] += bool(where)
            self.reads.corrupt(why, "served as a miss" + (f"; moved to {where}" if where else ""))
        elif outcome == diskread.ERROR:
            self.c["failed_reads"] += 1
            path = diskfs.file_path(self.root, fkey)
            self.fail(
                "read-" + diskfs.classify_os_error(detail), f"reading {path}: {diskfs.describe(detail)}"
            )

    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        return self.reads.fetch(ikeys, on_ready)

    def prewarm(self, ikeys: list[bytes]) -> int:
        return self.reads.request(ikeys, None, urgent=False)

    def count_misses(self, n: int) -> None:
        self.c["misses"] += n

    # -- deletes ----------------------------------------------------------------------------
    def delete(self, ikeys: list[bytes]) -> int:
        n = 0
        for ikey in ikeys:
            fkey = self.ns.fkey(ikey)
            self.writes.cancel(ikey)
            self.reads.cancel(ikey)
            if fkey in self.index:
                self.forget(fkey)
                n += 1
            else:  # the checkpoint or a load under way may still list it
                self._note_removed(fkey)
                if self.loading:
                    self._deleted_while_loading.add(fkey)
            self._unlink(fkey)
        return n

    # -- housekeeping -----------------------------------------------------------------------
    def tick(self) -> None:
        if self._young_temps:
            self._young_temps, removed = diskfs.sweep_young(self.root_fd, self.root, self._young_temps)
            self.c["stale_temp_removed"] += removed
        self.writes.tick()

    @property
    def state(self) -> str:
        if self.loading:
            return "loading"
        if any(c.startswith("write-") for c in self._failing):
            return "degraded"
        return "ready"

    def read_rate(self) -> float | None:
        return self.reads.read_gbps

    def stats(self) -> dict[str, Any]:
        return {
            "backend": "disk",
            "state": self.state,
            "path": self.root,
            "chunks": len(self.index),
            "bytes_used": self.bytes_used,
            "capacity": self.capacity,
            **self.writes.stats(),
            "reads_in_flight": len(self.reads.running),
            **self.reads.stats(),
            "index_load_s": self.index_load_s,
            "index_source": self.index_source,
            "index_detail": self.index_detail,
            "reconcile": self.reconcile,
            "reconcile_s": self.reconcile_s,
            "journal_records": self.journal.records + self.journal.count,
            "last_error": self.last_error,
            "fsync": self.sync,
            **self.c,
        }

    def close(self) -> None:
        """A clean stop (SIGTERM): the pipeline's last attempt at unwritten ``long`` chunks, then
        every thread stops before the arena goes; then the index is saved for the next start."""
        stopped = self.writes.stop(envvars.get("INFERA_KVD_DISK_STOP_S", STOP_BUDGET_S))
        self.reads.close(timeout=5.0)
        self.save_index(stopped)
        for fd in (self._lock_fd, self.root_fd):
            try:
                os.close(fd)
            except OSError:
                pass


if TYPE_CHECKING:
    _contract: type[FileBackedTier] = DiskTier  # mypy holds the tier to what the server uses

__all__ = ["DiskTier"]
