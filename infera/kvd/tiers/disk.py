"""L3: the disk long tier. ``long`` chunks persist as checksummed files under ``--long-path``.

Threading: the index, the accounting and every decision live on the daemon's loop thread; file
I/O runs on writer lanes, reader threads and one loader thread (see :mod:`diskio`), whose results
come back through ``Server.call_soon``. Consequences callers may rely on:

* The put path never waits for the disk. A sealed ``long`` chunk is pinned (so eviction cannot
  reuse its bytes) and queued; the queue is bounded by ``--long-write-queue`` jobs and by half the
  arena in bytes. A chunk that does not fit is counted in ``dropped_writes`` and kept in a backlog
  that is written once the queue drains, if it is still in RAM by then.
* A write that fails (ENOSPC, EIO...) leaves the chunk "not on the long tier"; it is retried with
  back-off while it is in RAM (:mod:`writeretry`), and a clean stop makes a last attempt at every
  ``long`` chunk in RAM not yet on disk (:meth:`DiskTier.close`). Evicting one counts as lost.
* A GET that misses RAM but hits disk is answered once reader threads have copied the file into
  the arena and verified its checksum (the reply is deferred; the loop keeps serving). A file that
  fails verification is a miss, is counted and is moved to ``<long-path>/quarantine``.
* At start the index is rebuilt from the files: only regular files whose header checks out are
  indexed (:func:`diskio.scan`). Until that is done the tier is ``loading``: LOOKUP and GET still
  find chunks on disk by checking the file the key maps to. No link under the root is followed.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from infera.kvd import chunkfile as cf
from infera.kvd.store import LONG, Chunk
from infera.kvd.tiers import diskio
from infera.kvd.tiers.diskio import WriteJob
from infera.kvd.tiers.diskread import Reads
from infera.kvd.tiers.writeretry import Retries

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.server import Server

log = logging.getLogger("infera.kvd.disk")

READERS = 4
MERGE_BATCH = 4096
BACKLOG_MAX = 65536
SECOND_CHANCES = 64  # files spared per eviction pass because their chunk is in RAM
STOP_BUDGET_S = 10.0  # a clean stop's last attempt at unwritten chunks (INFERA_KVD_DISK_STOP_S)


class DiskTier:
    """The ``disk`` long tier (see :mod:`infera.kvd.tiers` for the interface the server uses)."""

    backend = "disk"

    def __init__(self, cfg: DaemonConfig, server: Server) -> None:
        assert cfg.long_path is not None and cfg.long_bytes is not None
        assert server.store is not None and server.arena is not None
        self.server = server
        self.store = server.store
        self.root = os.path.abspath(cfg.long_path)
        self.capacity = cfg.long_bytes
        self.sync = cfg.fsync
        self.queue_max = max(1, cfg.long_write_queue)
        self.pin_max = server.arena.capacity // 2
        self._arena = server.arena.view
        self.root_fd, self._lock_fd = diskio.open_tree(self.root)
        self.index: OrderedDict[bytes, int] = OrderedDict()  # fkey -> file size, LRU first
        self.bytes_used = 0
        self.reserved = 0  # bytes of queued writes, counted against capacity before they land
        self.pinned = 0
        self.queued = 0
        self._ns: dict[int, tuple[bytes, bytes, str]] = {}  # ns id -> (digest, fkey prefix, text)
        self._ns_by_prefix: dict[bytes, int] = {}
        self._writes: dict[bytes, WriteJob] = {}  # newest queued write per fkey
        self._backlog: OrderedDict[bytes, None] = OrderedDict()  # ikeys of unwritten long chunks
        self.retries = Retries(float(os.environ.get("INFERA_KVD_DISK_RETRY_S", "0")) or 1.0)
        self._done: queue.SimpleQueue[tuple[WriteJob, OSError | None]] = queue.SimpleQueue()
        self._stop_by = 0.0  # set by close(): writes not started by then are skipped
        self._failing: dict[str, str] = {}  # condition -> first message, logged once
        self._deleted_while_loading: set[bytes] = set()
        self._young_temps: list[str] = []
        # lets tests hold writes in the queue (a slow disk on demand)
        self._test_write_delay = float(os.environ.get("INFERA_KVD_TEST_WRITE_DELAY_S", "0"))
        self.loading = True
        self.index_load_s: float | None = None
        self.last_error: str | None = None
        self.c = dict.fromkeys(
            (
                "hits",
                "misses",
                "bytes_read",
                "bytes_written",
                "files_written",
                "corrupt_chunks",
                "failed_writes",
                "failed_reads",
                "dropped_writes",
                "evicted_files",
                "evicted_unwritten",
                "prewarmed",
                "promotion_no_room",
                "files_other_version",
                "files_ignored",
                "quarantined",
                "stale_temp_removed",
                "write_retries",
                "recovered_writes",
            ),
            0,
        )
        self.store.c.setdefault("corrupt_chunks_total", 0)
        self.store.c.setdefault("long_unpersisted_evicted_total", 0)
        self.store.on_seal = self._on_seal
        self.store.on_drop = self._on_drop
        writers = int(os.environ.get("INFERA_KVD_DISK_WRITERS", "0")) or cfg.long_writers
        self._writers = diskio.Workers("disk-write", writers, self._write_job, lanes=True)
        self.reads = Reads(self, int(os.environ.get("INFERA_KVD_DISK_READERS", "0")) or READERS)
        self._load_started = time.monotonic()
        # the scan starts once the loop runs, so it never delays the daemon's first answer
        server.call_soon(threading.Thread(target=self._load, name="kvd-disk-load", daemon=True).start)
        diskio.check_space(self.root, self.capacity)

    # -- keys -------------------------------------------------------------------------------
    def ns_of(self, ikey: bytes) -> tuple[bytes, bytes, str]:
        nid = int.from_bytes(ikey[:2], "big")
        ns = self._ns.get(nid)
        if ns is None:
            text = self.store.ns_names[nid]
            digest = cf.ns_digest(text)
            ns = (digest, digest[:8], text)
            self._ns[nid] = ns
            self._ns_by_prefix[digest[:8]] = nid
        return ns

    def fkey(self, ikey: bytes) -> bytes:
        return self.ns_of(ikey)[1] + ikey[2:]

    def _in_ram(self, fkey: bytes) -> bool:
        nid = self._ns_by_prefix.get(fkey[:8])
        return nid is not None and nid.to_bytes(2, "big") + fkey[8:] in self.store.index

    # -- loading ----------------------------------------------------------------------------
    def _load(self) -> None:
        delay = os.environ.get("INFERA_KVD_TEST_LOAD_DELAY_S")  # lets tests observe "loading"
        if delay:
            time.sleep(float(delay))
        try:
            result = diskio.scan(self.root)
        except Exception as exc:  # never leave the tier loading forever
            log.exception("scanning the disk tier failed")
            result = diskio.ScanResult(unreadable=[f"{self.root}: {exc}"])
        entries = result.entries
        # newest first, each batch pushed to the LRU front, so the oldest file ends up first
        batches = [entries[max(0, i - MERGE_BATCH) : i] for i in range(len(entries), 0, -MERGE_BATCH)]
        for batch in batches:
            self.server.call_soon(functools.partial(self._merge, batch))
        self.server.call_soon(lambda: self._loaded(result))

    def _merge(self, batch: list[tuple[int, bytes, int]]) -> None:
        index = self.index
        skip = self._deleted_while_loading
        for _mtime, fkey, size in reversed(batch):
            if fkey in index or fkey in skip or fkey in self._writes:
                continue
            index[fkey] = size
            index.move_to_end(fkey, last=False)
            self.bytes_used += size

    def _loaded(self, result: diskio.ScanResult) -> None:
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
        log.info(
            "disk tier %s: %d chunk files, %d bytes of %d, indexed in %.3fs%s",
            self.root,
            len(self.index),
            self.bytes_used,
            self.capacity,
            self.index_load_s,
            f"; {result.other_version} files of another format version left alone"
            if result.other_version
            else "",
        )

    # -- capacity ---------------------------------------------------------------------------
    def _make_room(self, need: int) -> None:
        """Evict least-recently-used files until ``need`` more bytes fit. A file whose chunk is
        still in RAM gets one second chance, so a hot chunk keeps its copy on disk."""
        index = self.index
        chances = min(len(index), SECOND_CHANCES)
        while self.bytes_used + self.reserved + need > self.capacity and index:
            fkey = next(iter(index))
            if chances > 0 and (self._in_ram(fkey) or fkey in self.reads.reading):
                index.move_to_end(fkey)
                chances -= 1
                continue
            self.forget(fkey)
            if fkey in self._writes:
                continue  # a newer write of this chunk is queued: its rename replaces the file
            self.c["evicted_files"] += 1
            self._unlink(fkey)

    def forget(self, fkey: bytes) -> None:
        size = self.index.pop(fkey, None)
        if size is not None:
            self.bytes_used -= size

    def _unlink(self, fkey: bytes) -> None:
        self._writers.submit(("unlink", fkey), lane=hash(fkey))

    # -- writes -----------------------------------------------------------------------------
    def _on_seal(self, chunk: Chunk) -> None:
        if chunk.retention != LONG or chunk.on_long:
            return
        if not self._enqueue_write(chunk):
            self.c["dropped_writes"] += 1
            if len(self._backlog) < BACKLOG_MAX:
                self._backlog[chunk.ikey] = None

    def _on_drop(self, chunk: Chunk, reason: str) -> None:
        self.retries.drop(chunk.ikey)
        if reason == "evicted" and chunk.retention == LONG and not chunk.on_long:
            self.c["evicted_unwritten"] += 1  # data loss: the only copy is gone
            self.store.c["long_unpersisted_evicted_total"] += 1

    def _enqueue_write(self, chunk: Chunk, retry: bool = False) -> bool:
        """Queue a write-through of ``chunk``; False when the queue is full (nothing pinned)."""
        size = cf.HEADER_SIZE + chunk.length
        if size > self.capacity:
            self.fail("too_large", f"a {size}-byte chunk is larger than --long-bytes; not persisted")
            return True
        if self.queued >= self.queue_max or self.pinned + chunk.length > self.pin_max:
            return False
        digest, prefix, text = self.ns_of(chunk.ikey)
        fkey = prefix + chunk.key
        self._make_room(size)
        job = WriteJob(chunk, fkey, digest, text, retry)
        chunk.pins += 1
        self.pinned += chunk.length
        self.reserved += size
        self.queued += 1
        old = self._writes.get(fkey)
        if old is not None:
            old.cancelled = True
        self._writes[fkey] = job
        self._writers.submit(("write", job), lane=hash(fkey))
        return True

    def _write_job(self, item: tuple[str, Any]) -> None:
        kind, arg = item
        if kind == "unlink":
            try:
                diskio.unlink_chunk(self.root_fd, arg)
            except OSError as exc:
                why = f"unlink {diskio.file_path(self.root, arg)}: {exc}"
                self.server.call_soon(
                    functools.partial(self.fail, "unlink-" + diskio.classify_os_error(exc), why)
                )
            return
        job: WriteJob = arg
        if self._test_write_delay:
            time.sleep(self._test_write_delay)
        stopped = self._stop_by and time.monotonic() > self._stop_by
        err = None if stopped else diskio.write_job(job, self._arena, self.root_fd, self.sync)
        job.skipped |= bool(stopped)
        self._done.put((job, err))  # in a queue, so that close() finds what the loop did not see
        self.server.call_soon(self._drain_done)

    def _drain_done(self) -> None:
        while True:
            try:
                job, err = self._done.get_nowait()
            except queue.Empty:
                return
            self._write_done(job, err)

    def _write_done(self, job: WriteJob, err: OSError | None) -> None:
        chunk = job.chunk
        self.store.unpin(chunk)
        self.pinned -= chunk.length
        self.reserved -= job.size
        self.queued -= 1
        if self._writes.get(job.fkey) is job:
            del self._writes[job.fkey]
        live = not chunk.zombie and self.store.index.get(chunk.ikey) is chunk
        if err is not None:
            self.c["failed_writes"] += 1
            where = diskio.file_path(self.root, job.fkey)
            self.fail("write-" + diskio.classify_os_error(err), f"writing {where}: {diskio.describe(err)}")
            if live and not chunk.on_long and not job.cancelled:
                self.retries.failed(chunk.ikey, job.retry)  # still only in RAM: try again later
            else:
                self.retries.skipped(chunk.ikey, job.retry)
        elif not job.skipped and not job.cancelled:
            self.forget(job.fkey)
            self.index[job.fkey] = job.size
            self.bytes_used += job.size
            self.c["bytes_written"] += job.size
            self.c["files_written"] += 1
            if self.retries.succeeded(chunk.ikey, job.retry):
                self.c["recovered_writes"] += 1
            if not chunk.zombie:
                chunk.on_long = True
            self._recovered()
            self._make_room(0)
        else:
            self.retries.skipped(chunk.ikey, job.retry)
        self._drain_backlog()
        self._retry_due()

    def _retry_due(self) -> None:
        if self._stop_by:
            return
        for ikey in self.retries.due():
            chunk = self.store.index.get(ikey)
            if chunk is None or chunk.on_long or chunk.retention != LONG or self.fkey(ikey) in self._writes:
                self.retries.skipped(ikey, True)
            elif self._enqueue_write(chunk, retry=True):
                self.c["write_retries"] += 1
            else:
                self.retries.later(ikey)

    def _drain_backlog(self) -> None:
        while self._backlog and self.queued < self.queue_max:
            ikey, _ = self._backlog.popitem(last=False)
            chunk = self.store.index.get(ikey)
            if chunk is None or chunk.on_long or chunk.retention != LONG:
                continue
            if not self._enqueue_write(chunk):
                self._backlog[ikey] = None
                self._backlog.move_to_end(ikey, last=False)
                return

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

    # -- reads ------------------------------------------------------------------------------
    def contains_many(self, ikeys: list[bytes]) -> list[bool]:
        return [self.contains(k) for k in ikeys]

    def contains(self, ikey: bytes) -> bool:
        fkey = self.fkey(ikey)
        if fkey in self.index:
            return True
        return self.loading and self.probe(fkey) is not None

    def probe(self, fkey: bytes) -> int | None:
        """While the index loads, check the file itself (its header, never through a link) and
        index it if it is a usable chunk file."""
        if fkey in self._deleted_while_loading:
            return None
        v = diskio.check_chunk(self.root_fd, fkey)
        if v.kind != diskio.OK:
            return None
        self.index[fkey] = v.size
        self.bytes_used += v.size
        return v.size

    def promote(self, ikey: bytes) -> Chunk | None:
        """Called by GET for a key neither RAM nor a finished read could serve: a long-tier miss."""
        self.c["misses"] += 1
        return None

    def count_get(self, n: int, hits: int) -> None:
        """GET totals are counted by the server; this tier counts its own hits and misses."""

    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        """Read the chunks of ``ikeys`` that are on disk but not in RAM; True if ``on_ready``
        will be called (on the loop thread) once they are all in the arena or have failed."""
        return self.reads.fetch(ikeys, on_ready)

    def prewarm(self, ikeys: list[bytes]) -> int:
        return self.reads.request(ikeys, None, urgent=False)

    # -- files written by clients (GPU-direct) ------------------------------------------------
    def adopt(self, ikeys: list[bytes], lengths: list[int]) -> int:
        """Index chunk files a client wrote under our root (a header check each, on the loop:
        the header was just written, so it is in the page cache). A key whose file is missing or
        unusable is written through from RAM if RAM holds it."""
        n = 0
        for ikey, length in zip(ikeys, lengths, strict=True):
            fkey = self.fkey(ikey)
            v = diskio.check_chunk(self.root_fd, fkey)
            if v.kind != diskio.OK or v.size != cf.HEADER_SIZE + length:
                self.c["adopt_missing"] = self.c.get("adopt_missing", 0) + 1
                self.c["files_ignored"] += v.kind == diskio.IGNORED
                self.write_through([ikey])
                continue
            size = v.size
            job = self._writes.pop(fkey, None)
            if job is not None:
                job.cancelled = True
            self._backlog.pop(ikey, None)
            self.forget(fkey)
            self.index[fkey] = size
            self.bytes_used += size
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
            if chunk is None or chunk.retention != LONG or self.fkey(ikey) in self.index:
                continue
            chunk.on_long = False
            if chunk.sealed:
                self._on_seal(chunk)
            n += 1
        return n

    # -- deletes ----------------------------------------------------------------------------
    def delete(self, ikeys: list[bytes]) -> int:
        n = 0
        for ikey in ikeys:
            fkey = self.fkey(ikey)
            job = self._writes.pop(fkey, None)
            if job is not None:
                job.cancelled = True
            self.reads.cancel(ikey)
            self._backlog.pop(ikey, None)
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
            self._young_temps, removed = diskio.sweep_young(self.root_fd, self.root, self._young_temps)
            self.c["stale_temp_removed"] += removed
        self._drain_backlog()
        self._retry_due()

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
            "queued_writes": self.queued,
            "backlog": len(self._backlog),
            "unpersisted": len(self.retries),
            "reads_in_flight": self.reads.inflight,
            "index_load_s": self.index_load_s,
            "last_error": self.last_error,
            "fsync": self.sync,
            **self.c,
        }

    def close(self) -> None:
        """A clean stop (SIGTERM): a last attempt at every ``long`` chunk in RAM not yet on disk
        (queued, backlogged, or whose write failed), within ``INFERA_KVD_DISK_STOP_S`` (10 s),
        logging how many remain unwritten; then every thread stops before the arena goes."""
        budget = float(os.environ.get("INFERA_KVD_DISK_STOP_S", "0")) or STOP_BUDGET_S
        self._stop_by = time.monotonic() + budget
        self.queue_max = self.pin_max = 1 << 62  # the loop is gone: queue everything now
        self._backlog.clear()
        todo = [c for c in self.store.index.values() if c.retention == LONG and not c.on_long]
        for chunk in todo:
            if self.fkey(chunk.ikey) not in self._writes:
                self._enqueue_write(chunk)
        while self.queued > 0 and time.monotonic() < self._stop_by:  # the loop's part, here
            try:
                job, err = self._done.get(timeout=max(0.0, self._stop_by - time.monotonic()))
            except queue.Empty:
                break
            self._write_done(job, err)
        left = [c for c in todo if not c.on_long and not c.zombie]
        (log.warning if left else log.info)(
            "disk tier: clean stop: %d long chunks written, %d not written%s",
            len(todo) - len(left),
            len(left),
            f" (lost: {self.last_error or 'out of time'})" if left else "",
        )
        if not self._writers.close(timeout=max(0.5, self._stop_by - time.monotonic())):
            log.warning("disk tier: writes still running at shutdown; their chunks may be missing")
        self.reads.close(timeout=5.0)
        for fd in (self._lock_fd, self.root_fd):
            try:
                os.close(fd)
            except OSError:
                pass


__all__ = ["DiskTier"]
