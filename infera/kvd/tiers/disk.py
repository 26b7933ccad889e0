"""L3: the disk long tier. ``long`` chunks persist as checksummed files under ``--long-path``.

What only a disk has lives here: the file index, capacity with second-chance eviction, the scan
at start, ADOPT of client-written files, and the I/O hooks of the shared pipelines
(:mod:`.pipeline`: write-through and retries; :mod:`.promotions`: reads). File operations are in
:mod:`.diskfs`, :mod:`.diskscan` and :mod:`.diskread`. Beyond the pipelines' promises:

* A clean stop makes a last attempt at every ``long`` chunk in RAM not yet on disk, for at most
  ``INFERA_KVD_DISK_STOP_S`` (10 s).
* A file that fails verification when read is a miss, is counted and is moved to
  ``<long-path>/quarantine``.
* At start the index is rebuilt from the files: only regular files whose header checks out are
  indexed (:func:`diskscan.scan`). Until that is done the tier is ``loading``: LOOKUP and GET still
  find chunks on disk by checking the file the key maps to. No link under the root is followed.
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
from infera.kvd.keyspace import Namespace, key_of
from infera.kvd.store import LONG, Chunk
from infera.kvd.tiers import diskfs, diskread, diskscan
from infera.kvd.tiers.pipeline import WriteJob, WriteThrough
from infera.kvd.tiers.promotions import Promotions, ReadJob
from infera.units import format_size

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.tiers.base import FileBackedTier, TierHost

log = logging.getLogger("infera.kvd.disk")

READERS = 4
MERGE_BATCH = 4096
SECOND_CHANCES = 64  # files spared per eviction pass because their chunk is in RAM
STOP_BUDGET_S = 10.0  # a clean stop's last attempt at unwritten chunks (INFERA_KVD_DISK_STOP_S)


def _env(name: str) -> float:
    return float(os.environ.get(name, "0"))


class DiskTier:
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
        self._failing: dict[str, str] = {}  # condition -> first message, logged once
        self._deleted_while_loading: set[bytes] = set()
        self._young_temps: list[str] = []
        self._test_write_delay = _env("INFERA_KVD_TEST_WRITE_DELAY_S")  # a slow disk on demand
        self.loading = True
        self.index_load_s: float | None = None
        self.last_error: str | None = None
        self.c = dict.fromkeys(
            (
                *("hits", "misses", "bytes_read", "bytes_written", "files_written", "corrupt_chunks"),
                *("failed_writes", "failed_reads", "dropped_writes", "evicted_files", "evicted_unwritten"),
                *("prewarmed", "promotion_no_room", "files_other_version", "files_ignored", "quarantined"),
                *("stale_temp_removed", "write_retries", "recovered_writes"),
            ),
            0,
        )
        writers = int(_env("INFERA_KVD_DISK_WRITERS")) or cfg.long_writers
        retry_s = _env("INFERA_KVD_DISK_RETRY_S") or 1.0
        self.writes = WriteThrough(host, self, "disk-write", writers, cfg.long_write_queue, retry_s)
        self._files = diskread.FileReader(host.arena.view, self.root, self.root_fd)
        readers = int(_env("INFERA_KVD_DISK_READERS")) or READERS
        self.reads = Promotions(host, self, "disk-read", readers, deadline_s=None)
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

    # -- loading ----------------------------------------------------------------------------
    def _load(self) -> None:
        delay = os.environ.get("INFERA_KVD_TEST_LOAD_DELAY_S")  # lets tests observe "loading"
        if delay:
            time.sleep(float(delay))
        result, batches = diskscan.scan_batches(self.root, MERGE_BATCH)
        for batch in batches:
            self.host.call_soon(functools.partial(self._merge, batch))
        self.host.call_soon(lambda: self._loaded(result))

    def _merge(self, batch: list[tuple[int, bytes, int]]) -> None:
        index = self.index
        skip = self._deleted_while_loading
        for _mtime, fkey, size in reversed(batch):
            if fkey in index or fkey in skip or self._busy(fkey)[1]:
                continue
            index[fkey] = size
            index.move_to_end(fkey, last=False)
            self.bytes_used += size

    def _loaded(self, result: diskscan.ScanResult) -> None:
        self.loading = False
        self.index_load_s = round(time.monotonic() - self._load_started, 3)
        self._deleted_while_loading.clear()
        self.c["files_other_version"] += result.other_version
        self.c["files_ignored"] += result.ignored
        self.c["quarantined"] += result.quarantined
        self.c["stale_temp_removed"] += result.stale_temps
        self._young_temps = result.young_temps
        for problem in result.unreadable:
            self.fail("scan", f"cannot read {problem}")
        for what, outcome in result.corrupt:
            self.reads.corrupt(what, outcome)
        if result.ignored:
            log.warning("disk tier: %d links, directories or FIFOs under chunk names ignored", result.ignored)
        self._make_room(0)
        other = result.other_version
        log.info(
            "disk tier %s: %d chunk files, %s of %s, indexed in %.3fs%s",
            *(self.root, len(self.index), format_size(self.bytes_used), format_size(self.capacity)),
            self.index_load_s,
            f"; {other} files of another format version left alone" if other else "",
        )

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

    def _put(self, fkey: bytes, size: int) -> None:
        self.forget(fkey)
        self.index[fkey] = size
        self.bytes_used += size

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
        self._recovered()
        self._make_room(0)

    def failed(self, job: WriteJob, err: Exception) -> None:
        self.c["failed_writes"] += 1
        where = diskfs.file_path(self.root, job.where)
        self.fail("write-" + diskfs.classify_os_error(err), f"writing {where}: {diskfs.describe(err)}")

    # -- errors -----------------------------------------------------------------------------
    def fail(self, condition: str, message: str) -> None:
        self.last_error = message
        if condition not in self._failing:
            self._failing[condition] = message
            log.error("disk tier: %s (further %s errors are counted, not logged)", message, condition)

    def _recovered(self) -> None:
        """A write succeeded: write conditions are over (logged, so a relapse is logged again)."""
        write_conditions = [c for c in self._failing if c.startswith("write-")]
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

    # -- files written by clients (GPU-direct) ------------------------------------------------
    def adopt(self, ikeys: list[bytes], lengths: list[int]) -> int:
        """Index chunk files a client wrote under our root (a header check each, on the loop:
        the header was just written, so it is in the page cache). A key whose file is missing or
        unusable is written through from RAM if RAM holds it."""
        n = 0
        for ikey, length in zip(ikeys, lengths, strict=True):
            fkey = self.ns.fkey(ikey)
            v = diskscan.check_chunk(self.root_fd, fkey)
            if v.kind != diskscan.OK or v.size != cf.HEADER_SIZE + length:
                self.c["adopt_missing"] = self.c.get("adopt_missing", 0) + 1
                self.c["files_ignored"] += v.kind == diskscan.IGNORED
                self.write_through([ikey])
                continue
            self.writes.cancel(ikey)
            self._put(fkey, v.size)
            chunk = self.store.index.get(ikey)
            if chunk is not None:
                chunk.on_long = True
            n += 1
        self.c["adopted"] = self.c.get("adopted", 0) + n
        self._make_room(0)
        return n

    def write_through(self, ikeys: list[bytes]) -> int:
        """Chunks a client meant to persist itself but could not: write them the usual way."""
        n = 0
        for ikey in ikeys:
            # the client's SEAL may still be on its way: a pending chunk is written at its seal
            chunk = self.store.index.get(ikey) or self.store.pending.get(ikey)
            if chunk is None or chunk.retention != LONG or self.ns.fkey(ikey) in self.index:
                continue
            chunk.on_long = False
            if chunk.sealed:
                self.writes.on_seal(chunk)
            n += 1
        return n

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
            elif self.loading:
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
            "index_load_s": self.index_load_s,
            "last_error": self.last_error,
            "fsync": self.sync,
            **self.c,
        }

    def close(self) -> None:
        """A clean stop (SIGTERM): the pipeline's last attempt at unwritten ``long`` chunks, then
        every thread stops before the arena goes."""
        self.writes.stop(_env("INFERA_KVD_DISK_STOP_S") or STOP_BUDGET_S)
        self.reads.close(timeout=5.0)
        for fd in (self._lock_fd, self.root_fd):
            try:
                os.close(fd)
            except OSError:
                pass


if TYPE_CHECKING:
    _contract: type[FileBackedTier] = DiskTier  # mypy holds the tier to what the server uses

__all__ = ["DiskTier"]
