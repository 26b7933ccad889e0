"""Promotion of long-tier chunks into the arena, off the loop thread; the tier plugs in the read
itself (:class:`ReadBackend`).

A read gets an invisible region of the arena (``Store.reserve_hidden``): on the loop thread
before it starts when the tier knows the length, else from the reader thread through
:meth:`Promotions.room` once the tier has read it. A reader thread fills and verifies the
region; the loop thread publishes the chunk, or gives the room back and accounts the failure.
GETs wait for their reads through a :class:`Waiter` (answered when every read finished, or at
the tier's deadline); PREWARM reads queue behind them. At most two reads per reader thread are
under way, so a PREWARM of thousands of keys never holds the arena hostage.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from infera.kvd.keyspace import Namespace
from infera.kvd.store import Chunk
from infera.kvd.tiers.pipeline import Backend, Stage, Workers

if TYPE_CHECKING:
    from infera.kvd.tiers.base import TierHost

OK = "ok"
CORRUPT_LOG_MAX = 20  # corrupt chunks logged one by one; after that only counted
READ_COUNTERS = ("hits", "misses", "bytes_read", "prewarmed", "promotion_no_room", "corrupt_chunks")
ROOM_WAIT_S = 10.0  # a reader thread waits this long for the loop to find room
RATE_EWMA = 0.3  # weight of a new busy period in the measured read rate


class ReadJob:
    __slots__ = (
        "cancelled",
        "chunk",
        "created",
        "elapsed",
        "ikey",
        "length",
        "ns",
        "started",
        "waiters",
        "where",
    )

    def __init__(self, ikey: bytes, ns: Namespace, where: Any, length: int | None) -> None:
        self.ikey = ikey
        self.ns = ns
        self.where = where  # the tier's address of the chunk (file key, value name)
        self.length = length  # payload bytes, if the tier knows them before reading
        self.chunk: Chunk | None = None  # the hidden region being filled
        self.created = time.monotonic()
        self.started = 0.0  # when a reader took it (0: queued)
        self.elapsed = 0.0
        self.cancelled = False
        self.waiters: list[Waiter] = []


class Waiter:
    """One deferred request: ``done`` runs once every read it waits for has finished, or at
    ``deadline``; the chunks it will read stay pinned until then."""

    __slots__ = ("armed", "deadline", "done", "fired", "left", "pinned")

    def __init__(self, done: Callable[[], None], deadline: float | None) -> None:
        self.done = done
        self.deadline = deadline
        self.left = 0
        self.armed = False  # set once fetch() has returned, so done() never runs inside it
        self.fired = False
        self.pinned: list[Chunk] = []


class ReadBackend(Backend, Protocol):
    """The I/O half of a tier's :class:`Promotions` (see :mod:`.base`)."""

    def locate(self, ikey: bytes, ns: Namespace) -> tuple[Any, int | None] | None:
        """(address, payload length if known) of a chunk the tier may hold, or None."""

    def start(self, job: ReadJob) -> tuple[str, Any]:
        """Reader thread: read into ``job.chunk`` (or into :meth:`Promotions.room`); the
        outcome (``ok`` or the tier's word for what went wrong) and its detail."""

    def promoted(self, job: ReadJob) -> None:
        """Loop thread: the chunk was read, verified and published."""

    def read_failed(self, job: ReadJob, outcome: str, detail: Any) -> None:
        """Loop thread: the read did not work; the key is a miss."""


class Promotions(Stage):
    """Queued and running reads of one tier (loop thread, except :meth:`room` and the readers)."""

    def __init__(
        self, host: TierHost, backend: ReadBackend, threads: str, readers: int, deadline_s: float | None
    ) -> None:
        super().__init__(host, backend, READ_COUNTERS)
        self.backend: ReadBackend = backend
        self.store.c.setdefault("corrupt_chunks_total", 0)
        self.deadline_s = deadline_s
        self.jobs: dict[bytes, ReadJob] = {}  # by ikey
        self.running: dict[bytes, ReadJob] = {}  # the started ones, oldest first
        self.urgent: deque[ReadJob] = deque()
        self.background: deque[ReadJob] = deque()
        self.max_running = 2 * max(1, readers)
        self._waiters: list[Waiter] = []  # armed waiters with a deadline
        # The read rate: bytes read over the wall time while at least one read was under way,
        # per busy period (so parallel readers count once), smoothed. PREWARM answers with it:
        # a scheduler that judged this tier slower than recompute learns its rate again without
        # making a request wait for a measurement.
        self.read_gbps: float | None = None
        self._busy_since = 0.0
        self._busy_bytes = 0
        self.workers = Workers(threads, readers, self._run, lanes=False, log=self.log)

    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        ikeys = list(ikeys)
        deadline = None if self.deadline_s is None else time.monotonic() + self.deadline_s
        waiter = Waiter(on_ready, deadline)
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
        if deadline is not None:
            self._waiters.append(waiter)
        return True

    def request(self, ikeys: Iterable[bytes], waiter: Waiter | None, urgent: bool) -> int:
        """Queue reads of the keys the tier holds and RAM does not; how many are (now) queued."""
        n = 0
        store = self.store
        for ikey in ikeys:
            if ikey in store.index or (ikey in store.pending and ikey not in self.jobs):
                continue  # in RAM, or being written by a client
            job = self.jobs.get(ikey)
            if job is None:
                ns = self.ns.of(ikey)
                found = self.backend.locate(ikey, ns)
                if found is None:
                    continue
                job = ReadJob(ikey, ns, *found)
                self.jobs[ikey] = job
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

    def stalled(self, limit_s: float) -> bool:
        """True while a read has been under way longer than ``limit_s`` (the store hangs)."""
        oldest = next(iter(self.running.values()), None)
        return oldest is not None and time.monotonic() - oldest.started > limit_s

    def _reserve(self, job: ReadJob, length: int) -> Chunk | None:
        chunk = None if job.cancelled else self.store.reserve_hidden(job.ikey, length)
        if chunk is None and not job.cancelled and job.ikey not in self.store.index:
            self.c["promotion_no_room"] += 1
        job.chunk = chunk
        return chunk

    def _pump(self) -> None:
        while len(self.running) < self.max_running and (self.urgent or self.background):
            job = (self.urgent or self.background).popleft()
            if job.started or self.jobs.get(job.ikey) is not job:
                continue
            if job.cancelled or (job.length is not None and self._reserve(job, job.length) is None):
                self._finish(job, None)
                continue
            job.started = time.monotonic()
            if not self.running:
                self._busy_since, self._busy_bytes = job.started, 0
            self.running[job.ikey] = job
            self.workers.submit(job)

    def room(self, job: ReadJob, length: int) -> Chunk | None:
        """Reader thread: a hidden region of ``length`` bytes for ``job`` (asked again, the old
        one is given back), reserved by the loop thread; None if there is no room."""
        box: list[Chunk | None] = [None]
        ev = threading.Event()

        def reserve() -> None:
            if job.chunk is not None:
                self.store.cancel_hidden(job.chunk)
                job.chunk = None
            box[0] = self._reserve(job, length)
            ev.set()

        self.call_soon(reserve)
        return box[0] if ev.wait(ROOM_WAIT_S) else None

    def _run(self, job: ReadJob) -> None:
        t0 = time.monotonic()
        try:
            outcome, detail = self.backend.start(job)
        except Exception as exc:
            self.log.exception("%s: read failed", self.label)
            outcome, detail = "error", exc
        job.elapsed = time.monotonic() - t0
        self.call_soon(lambda: self._done(job, outcome, detail))

    def _done(self, job: ReadJob, outcome: str, detail: Any) -> None:
        self.running.pop(job.ikey, None)
        chunk = job.chunk
        ok = outcome == OK and chunk is not None and not job.cancelled
        if ok:
            assert chunk is not None
            self.store.publish(chunk)
            self.c["bytes_read"] += chunk.length
            self._busy_bytes += chunk.length
            self.c["hits" if job.waiters else "prewarmed"] += 1
            self.backend.promoted(job)
        else:
            if chunk is not None:
                self.store.cancel_hidden(chunk)
            if outcome != OK:
                self.backend.read_failed(job, outcome, detail)
        self._finish(job, chunk if ok else None)
        self._pump()
        if not self.running:
            self._busy_ended(time.monotonic())

    def _busy_ended(self, now: float) -> None:
        took, n = now - self._busy_since, self._busy_bytes
        self._busy_bytes = 0
        if n <= 0 or took <= 0:
            return
        gbps = n / took / 1e9
        old = self.read_gbps
        self.read_gbps = gbps if old is None else old + RATE_EWMA * (gbps - old)

    def stats(self) -> dict[str, float | None]:
        return {"read_gbps": None if self.read_gbps is None else round(self.read_gbps, 3)}

    def corrupt(self, what: str, outcome: str) -> None:
        """Account one corrupt chunk (read back, or found by a scan)."""
        self.c["corrupt_chunks"] += 1
        self.store.c["corrupt_chunks_total"] = self.store.c.get("corrupt_chunks_total", 0) + 1
        self.backend.last_error = f"corrupt chunk {what}"
        if self.c["corrupt_chunks"] <= CORRUPT_LOG_MAX:
            self.log.warning("%s: corrupt chunk %s, %s", self.label, what, outcome)

    def _finish(self, job: ReadJob, chunk: Chunk | None) -> None:
        if self.jobs.get(job.ikey) is job:
            del self.jobs[job.ikey]
        for w in job.waiters:
            if w.fired:
                continue
            if chunk is not None:
                chunk.pins += 1
                w.pinned.append(chunk)
            w.left -= 1
            if w.left == 0 and w.armed:
                self._fire(w)

    def _fire(self, w: Waiter) -> None:
        if w.fired:
            return
        w.fired = True
        try:
            w.done()
        finally:
            for c in w.pinned:
                self.store.unpin(c)
            w.pinned.clear()

    def expire(self) -> int:
        """Answer the waiters whose deadline passed (their unfinished keys are misses); how many."""
        if not self._waiters:
            return 0
        now = time.monotonic()
        keep: list[Waiter] = []
        late: list[Waiter] = []
        for w in self._waiters:
            if not w.fired:
                (late if w.deadline is not None and now >= w.deadline else keep).append(w)
        self._waiters = keep
        for w in late:
            self._fire(w)
        return len(late)

    def fire_all(self) -> None:
        """Answer every waiting request now (the store went away, or the daemon stops)."""
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            self._fire(w)

    def close(self, timeout: float) -> bool:
        self.fire_all()
        return self.workers.close(timeout)


__all__ = ["OK", "Promotions", "ReadBackend", "ReadJob", "Waiter"]
