"""The read side of the disk tier: promotion of chunk files into the arena, off the loop thread.

A read reserves an invisible region of the arena (``Store.reserve_hidden``) on the loop thread,
a reader thread copies the file into it with O_DIRECT and verifies the checksum, and the loop
thread publishes the chunk (or gives the room back and accounts the failure). GETs wait for
their reads through a :class:`Waiter`; PREWARM reads queue behind them. At most two reads per
reader thread are in flight, so a PREWARM of thousands of keys never holds the arena hostage.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from infera.kvd import chunkfile as cf
from infera.kvd.arena import align_up
from infera.kvd.store import Chunk
from infera.kvd.tiers import diskio

if TYPE_CHECKING:
    from infera.kvd.tiers.disk import DiskTier

log = logging.getLogger("infera.kvd.disk")

CORRUPT_LOG_MAX = 20  # corrupt files logged one by one; after that only counted


class ReadJob:
    __slots__ = ("cancelled", "chunk", "digest", "fkey", "ikey", "length", "path", "started", "waiters")

    def __init__(self, ikey: bytes, fkey: bytes, digest: bytes, path: str, length: int) -> None:
        self.ikey = ikey
        self.fkey = fkey
        self.digest = digest
        self.path = path
        self.length = length
        self.chunk: Chunk | None = None
        self.started = False
        self.cancelled = False
        self.waiters: list[Waiter] = []


class Waiter:
    """One deferred request: its callback runs when every read it waits for has finished."""

    __slots__ = ("armed", "done", "left", "pinned")

    def __init__(self, done: Callable[[], None]) -> None:
        self.done = done
        self.left = 0
        self.armed = False  # set once fetch() has returned, so done() never runs inside it
        self.pinned: list[Chunk] = []


class Reads:
    """Queued and running reads of one disk tier (loop thread, except :meth:`_read_job`)."""

    def __init__(self, tier: DiskTier, readers: int) -> None:
        self.t = tier
        self.store = tier.store
        self.jobs: dict[bytes, ReadJob] = {}  # by ikey
        self.reading: set[bytes] = set()  # fkeys with a job, so capacity eviction spares them
        self.urgent: deque[ReadJob] = deque()
        self.background: deque[ReadJob] = deque()
        self.inflight = 0
        self.max_inflight = 2 * readers
        self.direct = os.environ.get("INFERA_KVD_DISK_DIRECT", "1") != "0"
        self._arena = tier.server.arena.view if tier.server.arena is not None else memoryview(b"")
        self.workers = diskio.Workers("disk-read", readers, self._read_job, lanes=False)

    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        ikeys = list(ikeys)
        waiter = Waiter(on_ready)
        self.request(ikeys, waiter, urgent=True)
        if waiter.left == 0:
            return False
        ram = self.store.index
        for ikey in ikeys:  # what RAM holds now must still be there when the reply is built
            chunk = ram.get(ikey)
            if chunk is not None:
                chunk.pins += 1
                waiter.pinned.append(chunk)
        waiter.armed = True
        return True

    def request(self, ikeys: Iterable[bytes], waiter: Waiter | None, urgent: bool) -> int:
        """Queue reads of the keys on disk and not in RAM; returns how many are (now) queued."""
        t = self.t
        n = 0
        ram = self.store.index
        for ikey in ikeys:
            if ikey in ram:
                continue
            job = self.jobs.get(ikey)
            if job is None:
                fkey = t.fkey(ikey)
                size = t.index.get(fkey)
                if size is None and t.loading:
                    size = t.probe(fkey)
                if size is None or size < cf.HEADER_SIZE:
                    continue
                digest = t.ns_of(ikey)[0]
                job = ReadJob(ikey, fkey, digest, diskio.file_path(t.root, fkey), size - cf.HEADER_SIZE)
                self.jobs[ikey] = job
                self.reading.add(fkey)
                (self.urgent if urgent else self.background).append(job)
            elif urgent and not job.started and not job.waiters:
                self.urgent.append(job)
            if waiter is not None:
                job.waiters.append(waiter)
                waiter.left += 1
            n += 1
        self._pump()
        return n

    def cancel(self, ikey: bytes) -> None:
        job = self.jobs.get(ikey)
        if job is not None:
            job.cancelled = True

    def _pump(self) -> None:
        while self.inflight < self.max_inflight and (self.urgent or self.background):
            job = (self.urgent or self.background).popleft()
            if job.started or self.jobs.get(job.ikey) is not job:
                continue
            chunk = self.store.reserve_hidden(job.ikey, job.length)
            if chunk is None:
                if job.ikey not in self.store.index:
                    self.t.c["promotion_no_room"] += 1
                self._finish(job, ok=False)
                continue
            job.chunk = chunk
            job.started = True
            self.inflight += 1
            self.workers.submit(job)

    def _read_job(self, job: ReadJob) -> None:
        """Reader thread: file -> arena region, verified; the outcome goes back to the loop."""
        chunk = job.chunk
        assert chunk is not None
        outcome: str = "ok"
        detail: Any = None
        view = self._arena[chunk.offset : chunk.offset + align_up(chunk.length)]
        key = job.fkey[8:]
        try:
            try:
                cf.read_into(
                    job.path, view, length=chunk.length, digest=job.digest, key=key, direct=self.direct
                )
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self.direct = False  # this filesystem refuses O_DIRECT (tmpfs): use the page cache
                log.info(
                    "disk tier: %s does not support O_DIRECT; reading through the page cache", self.t.root
                )
                cf.read_into(job.path, view, length=chunk.length, digest=job.digest, key=key)
            # recency survives a restart: the index is rebuilt in mtime order
            os.utime(job.path, follow_symlinks=False)
        except FileNotFoundError:
            outcome = "missing"
        except cf.NotRegular as exc:  # a link, FIFO or directory put there since it was indexed
            outcome, detail = "ignored", str(exc)
        except cf.SizeChanged as exc:
            outcome, detail = "size", exc.size
        except cf.OtherVersion as exc:
            outcome, detail = "other", str(exc)
        except cf.CorruptChunk as exc:
            outcome, detail = "corrupt", (str(exc), diskio.quarantine(self.t.root_fd, job.fkey))
        except OSError as exc:
            outcome, detail = "error", exc
        finally:
            view.release()
        self.t.server.call_soon(lambda: self._read_done(job, outcome, detail))

    def _read_done(self, job: ReadJob, outcome: str, detail: Any) -> None:
        self.inflight -= 1
        chunk = job.chunk
        assert chunk is not None
        t = self.t
        ok = outcome == "ok" and not job.cancelled
        if ok:
            self.store.publish(chunk)
            t.c["bytes_read"] += chunk.length
            t.c["hits" if job.waiters else "prewarmed"] += 1
            if job.fkey in t.index:
                t.index.move_to_end(job.fkey)
        else:
            self.store.cancel_hidden(chunk)
            self._account_failure(job, outcome, detail)
        self._finish(job, ok)
        self._pump()

    def _account_failure(self, job: ReadJob, outcome: str, detail: Any) -> None:
        t = self.t
        if outcome == "missing":
            t.forget(job.fkey)
        elif outcome == "ignored":
            t.forget(job.fkey)
            t.c["files_ignored"] += 1
        elif outcome == "size":
            if job.fkey in t.index:
                t.bytes_used += detail - t.index[job.fkey]
                t.index[job.fkey] = detail
        elif outcome == "other":
            t.forget(job.fkey)
            t.c["files_other_version"] += 1
        elif outcome == "corrupt":
            t.forget(job.fkey)
            why, where = detail
            if where:
                t.c["quarantined"] += 1
            self.corrupt(f"{job.path}: {why}", "served as a miss" + (f"; moved to {where}" if where else ""))
        elif outcome == "error":
            t.c["failed_reads"] += 1
            t.fail("read-" + diskio.classify_os_error(detail), f"reading {job.path}: {detail.strerror}")

    def corrupt(self, what: str, outcome: str) -> None:
        """Account one corrupt chunk file, read back or found by the scan at start."""
        t = self.t
        t.c["corrupt_chunks"] += 1
        self.store.c["corrupt_chunks_total"] = self.store.c.get("corrupt_chunks_total", 0) + 1
        t.last_error = f"corrupt chunk {what}"
        if t.c["corrupt_chunks"] <= CORRUPT_LOG_MAX:
            log.warning("disk tier: corrupt chunk %s, %s", what, outcome)

    def _finish(self, job: ReadJob, ok: bool) -> None:
        if self.jobs.get(job.ikey) is job:
            del self.jobs[job.ikey]
            self.reading.discard(job.fkey)
        chunk = job.chunk if ok else None
        for w in job.waiters:
            if chunk is not None:
                chunk.pins += 1
                w.pinned.append(chunk)
            w.left -= 1
            if w.left == 0 and w.armed:
                try:
                    w.done()
                finally:
                    for c in w.pinned:
                        self.store.unpin(c)

    def close(self, timeout: float) -> bool:
        return self.workers.close(timeout)


__all__ = ["ReadJob", "Reads", "Waiter"]
