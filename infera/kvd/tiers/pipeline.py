"""The write-through pipeline every long tier shares; the tier plugs in its I/O (:class:`WriteBackend`).

Threading: every decision and counter lives on the loop thread; the blocking write runs on
writer lanes (one thread each; jobs are spread over lanes by address, so two writes, or a write
and a remove, of one address never race) and comes back through ``call_soon``. Consequences
callers may rely on:

* The put path never waits for the tier. A sealed ``long`` chunk is pinned (eviction cannot
  reuse its bytes) and queued; the queue is bounded by ``--long-write-queue`` jobs and by half
  the arena in bytes. A chunk that does not fit, or that arrives while the tier takes no
  writes (``WriteBackend.accepting``), is counted in ``dropped_writes`` and kept in a backlog
  that is written once the queue drains, if it is still in RAM by then.
* A write that fails leaves the chunk "not on the long tier"; it is retried with back-off while
  it is in RAM (:mod:`.writeretry`). A ``long`` chunk evicted before any write of it succeeded
  is counted as lost (``evicted_unwritten``, top-level ``long_unpersisted_evicted_total``).
* A clean stop (:meth:`WriteThrough.stop`) makes a last attempt at every ``long`` chunk in RAM
  not yet on the tier, within a budget, and logs how many remain unwritten.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from infera.kvd import chunkfile as cf
from infera.kvd.keyspace import Namespace
from infera.kvd.store import LONG, Chunk
from infera.kvd.tiers.workers import Workers
from infera.kvd.tiers.writeretry import Retries

if TYPE_CHECKING:
    from infera.kvd.namespaces import NamespaceTable
    from infera.kvd.tiers.base import TierHost

BACKLOG_MAX = 65536
WRITE_COUNTERS = ("dropped_writes", "write_retries", "recovered_writes", "evicted_unwritten")


class WriteJob:
    """One write of a sealed chunk to ``where`` (the chunk is pinned while the job is queued)."""

    __slots__ = (
        *("cancelled", "chunk", "elapsed", "ns", "replace", "retry", "skipped", "started", "stuck", "where"),
    )

    def __init__(self, chunk: Chunk, ns: Namespace, where: Any, retry: bool) -> None:
        self.chunk = chunk
        self.ns = ns
        self.where = where
        self.retry = retry  # handed out by Retries.due
        self.replace = False  # an older value of this key may be stored: replace it
        self.cancelled = False
        self.skipped = False
        self.started = 0.0  # time.monotonic() when the writer thread began it
        self.elapsed = 0.0  # seconds the write took (set by the writer thread)
        self.stuck = False  # counted by WriteThrough.stuck as under way past the deadline

    @property
    def size(self) -> int:
        """Bytes stored: the chunk-file header and the payload."""
        return cf.HEADER_SIZE + self.chunk.length


class Backend(Protocol):
    """What both pipelines read of the tier they serve."""

    last_error: str | None  # the last failure, in words (the pipelines set it too)

    @property
    def ns(self) -> NamespaceTable:
        """The store's namespace table (``store.ns``)."""

    @property
    def c(self) -> dict[str, int]:
        """The tier's counters (STATS ``tiers.long``); the pipelines add theirs."""

    @property
    def label(self) -> str:
        """How log lines name the tier: ``disk tier``, ``mooncake long tier``."""

    @property
    def log(self) -> logging.Logger: ...


class WriteBackend(Backend, Protocol):
    """The I/O half of a tier's :class:`WriteThrough` (see :mod:`.base`)."""

    def address(self, chunk: Chunk, ns: Namespace) -> Any:
        """Where ``chunk`` goes (hashable), or None when it can never be written (the tier says why)."""

    def accepting(self) -> bool:
        """False while new writes must wait in the backlog."""

    def admitted(self, job: WriteJob) -> None:
        """Loop thread: ``job`` is queued (the disk tier makes room for it)."""

    def write(self, job: WriteJob) -> Exception | None:
        """Writer thread: write ``job.chunk``; the error, if any."""

    def landed(self, job: WriteJob) -> None:
        """Loop thread: the write succeeded."""

    def failed(self, job: WriteJob, err: Exception) -> None:
        """Loop thread: the write failed (count and log it; the retry is the pipeline's)."""


class Stage:
    """What both pipelines hold: the loop's store and ``call_soon``, and the tier they serve."""

    def __init__(self, host: TierHost, backend: Backend, counters: tuple[str, ...]) -> None:
        self.store = host.store
        self.call_soon = host.call_soon
        self.backend = backend
        self.ns = backend.ns
        self.c = backend.c
        for k in counters:
            self.c.setdefault(k, 0)
        self.label = backend.label
        self.log = backend.log


class WriteThrough(Stage):
    """Write-through of sealed ``long`` chunks to one tier. Installs the store's seal/drop hooks."""

    def __init__(
        self,
        host: TierHost,
        backend: WriteBackend,
        threads: str,
        writers: int,
        queue_max: int,
        retry_s: float,
    ) -> None:
        super().__init__(host, backend, WRITE_COUNTERS)
        self.backend: WriteBackend = backend
        self.queue_max = max(1, queue_max)
        self.pin_max = host.arena.capacity // 2
        self.pinned = 0  # payload bytes pinned by queued writes
        self.queued = 0
        self.jobs: dict[bytes, WriteJob] = {}  # newest queued write per ikey
        self.backlog: OrderedDict[bytes, None] = OrderedDict()  # ikeys of unwritten long chunks
        self.retries = Retries(retry_s)
        self._overwritten: set[bytes] = set()  # ikeys whose older value the tier may still hold
        self._done: queue.SimpleQueue[tuple[WriteJob, Exception | None]] = queue.SimpleQueue()
        self.stop_by = 0.0  # set by stop(): writes not started by then are skipped
        self.lanes = Workers(threads, writers, self._run, lanes=True, log=self.log)
        self.store.c.setdefault("long_unpersisted_evicted_total", 0)
        self.store.on_seal = self.on_seal
        self.store.on_drop = self._on_drop

    # -- loop thread ---------------------------------------------------------------------------
    def on_seal(self, chunk: Chunk) -> None:
        if chunk.retention != LONG or chunk.on_long:
            return
        if not self.enqueue(chunk):
            self.c["dropped_writes"] += 1
            if len(self.backlog) < BACKLOG_MAX:
                self.backlog[chunk.ikey] = None

    def _on_drop(self, chunk: Chunk, reason: str) -> None:
        self.retries.drop(chunk.ikey)
        if reason == "overwrite" and chunk.retention == LONG:
            self._overwritten.add(chunk.ikey)
        if reason == "evicted" and chunk.retention == LONG and not chunk.on_long:
            self.c["evicted_unwritten"] += 1  # data loss: the only copy is gone
            self.store.c["long_unpersisted_evicted_total"] += 1

    def enqueue(self, chunk: Chunk, retry: bool = False) -> bool:
        """Queue a write of ``chunk``; False when it has to wait (nothing pinned then). A chunk the
        tier can never hold counts as handled."""
        ikey = chunk.ikey
        ns = self.ns.of(ikey)
        where = self.backend.address(chunk, ns)
        if where is None:
            if retry:
                self.retries.skipped(ikey, True)
            return True
        if (
            self.queued >= self.queue_max
            or self.pinned + chunk.length > self.pin_max
            or not self.backend.accepting()
        ):
            return False
        job = WriteJob(chunk, ns, where, retry)
        if ikey in self._overwritten:
            self._overwritten.discard(ikey)
            job.replace = True
        chunk.pins += 1
        self.pinned += chunk.length
        self.queued += 1
        old = self.jobs.get(ikey)
        if old is not None:
            old.cancelled = True
        self.jobs[ikey] = job
        self.backend.admitted(job)
        self.lanes.submit(job, lane=hash(where))
        return True

    def after(self, where: Any, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the writer lane of ``where``, after every write queued there (removes)."""
        self.lanes.submit(fn, lane=hash(where))

    def cancel(self, ikey: bytes) -> None:
        """Forget the queued and backlogged writes of ``ikey`` (deleted, or written by a client)."""
        job = self.jobs.pop(ikey, None)
        if job is not None:
            job.cancelled = True
        self.backlog.pop(ikey, None)

    def rewrite(self, chunks: Iterable[Chunk]) -> int:
        """Write ``chunks`` again (the store lost them); as the backlog drains. How many queued."""
        n = 0
        for chunk in chunks:
            if len(self.backlog) >= BACKLOG_MAX:
                break
            chunk.on_long = False
            self.backlog[chunk.ikey] = None
            n += 1
        self.drain_backlog()
        return n

    def _drain(self) -> None:
        while True:
            try:
                job, err = self._done.get_nowait()
            except queue.Empty:
                return
            self._settle(job, err)

    def _settle(self, job: WriteJob, err: Exception | None) -> None:
        chunk = job.chunk
        ikey = chunk.ikey
        self.store.unpin(chunk)
        self.pinned -= chunk.length
        self.queued -= 1
        if self.jobs.get(ikey) is job:
            del self.jobs[ikey]
        live = not chunk.zombie and self.store.index.get(ikey) is chunk
        if err is not None:
            if job.replace:
                self._overwritten.add(ikey)
            self.backend.failed(job, err)
            if live and not chunk.on_long and not job.cancelled:
                self.retries.failed(ikey, job.retry)  # still only in RAM: try again later
            else:
                self.retries.skipped(ikey, job.retry)
        elif not job.skipped and not job.cancelled:
            self.backend.landed(job)
            if self.retries.succeeded(ikey, job.retry):
                self.c["recovered_writes"] += 1
            if not chunk.zombie:
                chunk.on_long = True
        else:
            self.retries.skipped(ikey, job.retry)
        self.drain_backlog()
        self._retry_due()

    def _retry_due(self) -> None:
        if self.stop_by:
            return
        for ikey in self.retries.due():
            chunk = self.store.index.get(ikey)
            if chunk is None or chunk.on_long or chunk.retention != LONG or ikey in self.jobs:
                self.retries.skipped(ikey, True)
            elif self.enqueue(chunk, retry=True):
                self.c["write_retries"] += 1
            else:
                self.retries.later(ikey)

    def drain_backlog(self) -> None:
        while self.backlog and self.queued < self.queue_max:
            ikey, _ = self.backlog.popitem(last=False)
            chunk = self.store.index.get(ikey)
            if chunk is None or chunk.on_long or chunk.retention != LONG:
                continue
            if not self.enqueue(chunk):
                self.backlog[ikey] = None
                self.backlog.move_to_end(ikey, last=False)
                return

    def tick(self) -> None:
        self.drain_backlog()
        self._retry_due()

    def stuck(self, limit_s: float) -> tuple[int, int]:
        """Writes under way on a writer thread for longer than ``limit_s`` (the store hangs):
        how many, and how many of them this call is the first to see."""
        now = time.monotonic()
        n = new = 0
        for job in self.jobs.values():
            if job.started and not job.elapsed and now - job.started > limit_s:
                n += 1
                if not job.stuck:
                    job.stuck = True
                    new += 1
        return n, new

    def unpersisted(self) -> int:
        """``long`` chunks in RAM the tier does not have yet and this pipeline tracks: queued or
        being written, in the backlog, or waiting for a retry (each chunk once)."""
        n = len(self.jobs)
        n += sum(1 for k in self.backlog if k not in self.jobs)
        n += sum(1 for k in self.retries.waiting if k not in self.jobs and k not in self.backlog)
        return n

    def stats(self) -> dict[str, int]:
        return {"queued_writes": self.queued, "backlog": len(self.backlog), "unpersisted": self.unpersisted()}

    # -- writer threads ------------------------------------------------------------------------
    def _run(self, item: WriteJob | Callable[[], None]) -> None:
        if not isinstance(item, WriteJob):
            item()
            return
        job = item
        err: Exception | None = None
        if job.cancelled or job.chunk.zombie or (self.stop_by and time.monotonic() > self.stop_by):
            job.skipped = True
        else:
            job.started = time.monotonic()
            try:
                err = self.backend.write(job)
            except Exception as exc:
                self.log.exception("%s: write failed", self.label)
                err = exc
            job.elapsed = time.monotonic() - job.started
        self._done.put((job, err))  # in a queue, so that stop() finds what the loop did not see
        self.call_soon(self._drain)

    # -- a clean stop --------------------------------------------------------------------------
    def stop(self, budget_s: float) -> bool:
        """A last attempt at every ``long`` chunk in RAM not yet on the tier (queued, backlogged,
        or whose write failed), within ``budget_s``; logs how many remain unwritten, then stops
        the writer lanes (False: one was still busy). Runs on the loop thread after the loop has
        stopped."""
        self.stop_by = time.monotonic() + budget_s
        self.queue_max = self.pin_max = 1 << 62  # the loop is gone: queue everything now
        self.backlog.clear()
        todo = [c for c in self.store.index.values() if c.retention == LONG and not c.on_long]
        for chunk in todo:
            if chunk.ikey not in self.jobs:
                self.enqueue(chunk)
        while self.queued > 0 and time.monotonic() < self.stop_by:  # the loop's part, here
            try:
                job, err = self._done.get(timeout=max(0.0, self.stop_by - time.monotonic()))
            except queue.Empty:
                break
            self._settle(job, err)
        left = [c for c in todo if not c.on_long and not c.zombie]
        (self.log.warning if left else self.log.info)(
            "%s: clean stop: %d long chunks written, %d not written%s",
            self.label,
            len(todo) - len(left),
            len(left),
            f" (lost: {self.backend.last_error or 'out of time'})" if left else "",
        )
        if not self.lanes.close(timeout=max(0.5, self.stop_by - time.monotonic())):
            self.log.warning("%s: writes still running at shutdown; their chunks may be missing", self.label)
            return False
        return True


__all__ = ["BACKLOG_MAX", "Backend", "Stage", "Workers", "WriteBackend", "WriteJob", "WriteThrough"]
