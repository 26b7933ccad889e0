"""L4: the distributed long tier, shared by the ``mooncake`` and ``lmcache`` backends.

A backend is a :class:`Transport` (put, get, exists, remove against one store); this module owns
everything else, so both backends behave the same way:

* Values are chunk files: the 4 KiB header of :mod:`infera.kvd.chunkfile` (key, namespace digest,
  payload length, checksums) followed by the payload. A value read back is verified exactly like
  a disk chunk; a bad one is counted in ``corrupt_chunks``, served as a miss and removed from the
  store so a writer can replace it.
* Names are a pure function of (namespace text, key), never of the daemon's own namespace ids, so
  every daemon that serves a namespace finds the chunks the others wrote.
* Threads do the network I/O; the index, the arena and every decision stay on the loop thread
  (results come back through ``Server.call_soon``). Puts never wait: a sealed ``long`` chunk is
  pinned and written by writer lanes. A GET that misses RAM is deferred while reader threads
  copy the value into the arena (``fetch``); it is answered within ``FETCH_TIMEOUT_S`` whatever
  the store does. LOOKUP asks the store whether a key exists and waits at most
  ``CONTAINS_TIMEOUT_S``.
* A monitor thread probes the store every second and (re)connects. While the store is
  unreachable the tier is ``disconnected``: no call is made at all, writes go to a backlog that
  is written once it is back, deferred GETs are answered at once. Errors keep the state
  ``degraded`` for ``DEGRADED_HOLD_S``. Each state change is logged once and counted.
"""

from __future__ import annotations

import logging
import mmap
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from infera.kvd import chunkfile as cf
from infera.kvd.store import LONG, Chunk
from infera.kvd.tiers.diskio import Workers
from infera.kvd.tiers.l4link import LOG_MAX, Link
from infera.kvd.tiers.transport import HEADER, Region, Transport, TransportError, buffer_address, verify

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.server import Server

log = logging.getLogger("infera.kvd.l4")

READERS = 2
FETCH_TIMEOUT_S = 2.0
CONTAINS_TIMEOUT_S = 0.25
KNOWN_TTL_S = 2.0
KNOWN_MAX = 65536
BACKLOG_MAX = 65536
PAUSE_S = 2.0  # after a write failed for lack of room or of the store, writes wait this long


class WriteJob:
    __slots__ = ("cancelled", "chunk", "digest", "name", "ns_text", "replace")

    def __init__(self, chunk: Chunk, name: str, digest: bytes, ns_text: str, replace: bool) -> None:
        self.chunk = chunk
        self.name = name
        self.digest = digest
        self.ns_text = ns_text
        self.replace = replace
        self.cancelled = False


class ReadJob:
    __slots__ = ("cancelled", "chunk", "digest", "ikey", "name", "started", "waiters")

    def __init__(self, ikey: bytes, name: str, digest: bytes) -> None:
        self.ikey = ikey
        self.name = name
        self.digest = digest
        self.chunk: Chunk | None = None
        self.started = time.monotonic()
        self.cancelled = False
        self.waiters: list[Waiter] = []


class Waiter:
    """One deferred GET: answered when all its reads finished, or at its deadline."""

    __slots__ = ("armed", "deadline", "done", "fired", "left", "pinned")

    def __init__(self, done: Callable[[], None], deadline: float) -> None:
        self.done = done
        self.deadline = deadline
        self.left = 0
        self.armed = False
        self.fired = False
        self.pinned: list[Chunk] = []


class RemoteTier(Link):
    """A distributed long tier over ``transport`` (see :mod:`infera.kvd.tiers` for the interface)."""

    backend = "?"

    def __init__(self, cfg: DaemonConfig, server: Server, transport: Transport) -> None:
        assert server.store is not None and server.arena is not None
        self.store = server.store
        self.queue_max = max(1, cfg.long_write_queue)
        self.pin_max = server.arena.capacity // 2
        self._arena = server.arena.view
        self._arena_ptr = buffer_address(server.arena.map)
        nslots = max(1, cfg.long_writers) + READERS + 1
        self._slot_map = mmap.mmap(-1, nslots * HEADER)
        self._slot_ptr = buffer_address(self._slot_map)
        self._slot_view = memoryview(self._slot_map)
        self._free_slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(nslots):
            self._free_slots.put(i)
        self._ns: dict[int, tuple[bytes, str]] = {}
        self._reads: dict[bytes, ReadJob] = {}
        self._writes: dict[bytes, WriteJob] = {}
        self._waiters: list[Waiter] = []
        self._backlog: OrderedDict[bytes, None] = OrderedDict()
        self._known: OrderedDict[bytes, float] = OrderedDict()  # ikey -> when the store had it
        self._replace: set[bytes] = set()
        self._pause_until = 0.0
        self.queued = 0
        self.pinned = 0
        self.chunks = 0
        self.bytes_used = 0
        counters = dict.fromkeys(
            (
                "hits",
                "misses",
                "bytes_read",
                "bytes_written",
                "chunks_written",
                "corrupt_chunks",
                "failed_writes",
                "failed_reads",
                "dropped_writes",
                "backpressure",
                "timeouts",
                "errors",
                "prewarmed",
                "promotion_no_room",
                "removed",
                "resynced",
                "state_changes",
                "disconnects",
                "reconnects",
                "exists_calls",
                "exists_keys",
            ),
            0,
        )
        super().__init__(server, transport, counters)
        self.store.c.setdefault("corrupt_chunks_total", 0)
        self.store.on_seal = self._on_seal
        self.store.on_drop = self._on_drop
        self._writers = Workers("l4-write", cfg.long_writers, self._write_job, lanes=True)
        self._lane_load = [0] * len(self._writers.queues)
        self._lane_of: dict[bytes, list[int]] = {}  # ikey -> [lane, jobs queued there]
        self._readers = Workers("l4-read", READERS, self._read_job, lanes=False)
        self._start_link()

    def _regions(self) -> tuple[Region, Region]:
        return Region(self._arena, self._arena_ptr), Region(self._slot_view, self._slot_ptr)

    def _reconnected(self) -> None:
        self._resync()

    def _disconnected(self) -> None:
        self._fire_all()

    # -- names ------------------------------------------------------------------------------
    def _ns_of(self, ikey: bytes) -> tuple[bytes, str]:
        nid = int.from_bytes(ikey[:2], "big")
        ns = self._ns.get(nid)
        if ns is None:
            text = self.store.ns_names[nid]
            ns = (cf.ns_digest(text), text)
            self._ns[nid] = ns
        return ns

    def _name(self, ikey: bytes) -> tuple[str, bytes, str]:
        digest, text = self._ns_of(ikey)
        return self.t.name(digest, ikey[2:]), digest, text

    def _resync(self) -> None:
        """After the store was unreachable (a Mooncake master restart loses every key), write
        the ``long`` chunks RAM still holds again; the backlog feeds the writers as they drain."""
        self._known.clear()
        self.chunks = 0
        self.bytes_used = 0
        n = 0
        for ikey, chunk in self.store.chunks_of(LONG):
            if len(self._backlog) >= BACKLOG_MAX:
                break
            chunk.on_long = False
            self._backlog[ikey] = None
            n += 1
        self.c["resynced"] += n
        if n:
            log.info("%s long tier: rewriting %d chunks held in RAM after reconnecting", self.backend, n)
        self._drain_backlog()

    # -- writes -----------------------------------------------------------------------------
    def _on_seal(self, chunk: Chunk) -> None:
        if chunk.retention != LONG or chunk.on_long:
            return
        if not self._enqueue_write(chunk):
            self.c["dropped_writes"] += 1
            if len(self._backlog) < BACKLOG_MAX:
                self._backlog[chunk.ikey] = None

    def _on_drop(self, chunk: Chunk, reason: str) -> None:
        if reason == "overwrite":
            self._replace.add(chunk.ikey)

    def _enqueue_write(self, chunk: Chunk) -> bool:
        if (
            not self._usable()
            or self.queued >= self.queue_max
            or self.pinned + chunk.length > self.pin_max
            or time.monotonic() < self._pause_until
        ):
            return False
        name, digest, text = self._name(chunk.ikey)
        replace = chunk.ikey in self._replace
        self._replace.discard(chunk.ikey)
        job = WriteJob(chunk, name, digest, text, replace)
        old = self._writes.get(chunk.ikey)
        if old is not None:
            old.cancelled = True
        self._writes[chunk.ikey] = job
        chunk.pins += 1
        self.pinned += chunk.length
        self.queued += 1
        self._submit_write(chunk.ikey, ("put", job))
        return True

    def _submit_write(self, ikey: bytes, item: tuple[str, Any]) -> None:
        """Queue a put or remove on the least loaded writer lane, or on the lane that already
        holds a job for ``ikey`` (jobs of one key run in order)."""
        entry = self._lane_of.get(ikey)
        if entry is None:
            lane = min(range(len(self._lane_load)), key=self._lane_load.__getitem__)
            entry = self._lane_of[ikey] = [lane, 0]
        entry[1] += 1
        self._lane_load[entry[0]] += 1
        self._writers.submit((ikey, *item), lane=entry[0])

    def _lane_done(self, ikey: bytes) -> None:
        entry = self._lane_of[ikey]
        self._lane_load[entry[0]] -= 1
        entry[1] -= 1
        if entry[1] == 0:
            del self._lane_of[ikey]

    def _slot(self) -> tuple[int, Region]:
        i = self._free_slots.get()
        return i, Region(self._slot_view[i * HEADER : (i + 1) * HEADER], self._slot_ptr + i * HEADER)

    def _write_job(self, item: tuple[bytes, str, Any]) -> None:
        ikey, kind, arg = item
        if kind == "remove":
            err: TransportError | None = None
            ok = False
            try:
                ok = self.t.remove(arg)
            except TransportError as exc:
                err = exc
            self.server.call_soon(lambda: self._remove_done(ikey, arg, ok, err))
            return
        job: WriteJob = arg
        chunk = job.chunk
        err = None
        elapsed = 0.0
        if job.cancelled or chunk.zombie:
            self.server.call_soon(lambda: self._write_done(job, None, 0.0, skipped=True))
            return
        i, slot = self._slot()
        view = self._arena[chunk.offset : chunk.offset + chunk.length]
        try:
            header = cf.make_header(job.digest, chunk.key, view, namespace_text=job.ns_text)
            slot.view[:] = header.pack()
            t0 = time.monotonic()
            self.t.put(job.name, slot, Region(view, self._arena_ptr + chunk.offset), job.replace)
            elapsed = time.monotonic() - t0
        except TransportError as exc:
            err = exc
        except Exception as exc:
            log.exception("%s long tier: write failed", self.backend)
            err = TransportError(f"{type(exc).__name__}: {exc}")
        finally:
            view.release()
            self._free_slots.put(i)
        self.server.call_soon(lambda: self._write_done(job, err, elapsed))

    def _remove_done(self, ikey: bytes, name: str, ok: bool, err: TransportError | None) -> None:
        self._lane_done(ikey)
        if err is not None:
            self._trouble(err.kind, f"remove {name}: {err}")
        elif ok:
            self.c["removed"] += 1

    def _write_done(
        self, job: WriteJob, err: TransportError | None, elapsed: float, skipped: bool = False
    ) -> None:
        chunk = job.chunk
        self._lane_done(chunk.ikey)
        self.store.unpin(chunk)
        self.pinned -= chunk.length
        self.queued -= 1
        if self._writes.get(chunk.ikey) is job:
            del self._writes[chunk.ikey]
        if err is not None:
            # No room (the master evicts asynchronously; right after a master restart the storage
            # nodes have not remounted yet) or no store: keep the chunk for a later try.
            retry = err.kind in ("full", "down")
            if err.kind == "full":
                self.c["backpressure"] += 1
                self._trouble("full", f"store full, write of {job.name} postponed: {err}")
            else:
                self.c["failed_writes"] += 1
                self._trouble(err.kind, f"write of {job.name} failed: {err}")
            if retry:
                self._pause_until = time.monotonic() + PAUSE_S
                if not chunk.zombie and len(self._backlog) < BACKLOG_MAX:
                    self._backlog[chunk.ikey] = None
        elif not skipped and not job.cancelled:
            self._latency("write_ms", elapsed)
            self.c["bytes_written"] += HEADER + chunk.length
            self.c["chunks_written"] += 1
            self.chunks += 1
            self.bytes_used += HEADER + chunk.length
            self._remember(chunk.ikey)
            if not chunk.zombie:
                chunk.on_long = True
        self._drain_backlog()

    def _drain_backlog(self) -> None:
        while self._backlog and self._usable() and self.queued < self.queue_max:
            ikey, _ = self._backlog.popitem(last=False)
            chunk = self.store.index.get(ikey)
            if chunk is None or chunk.on_long or chunk.retention != LONG:
                continue
            if not self._enqueue_write(chunk):
                self._backlog[ikey] = None
                self._backlog.move_to_end(ikey, last=False)
                return

    def _remember(self, ikey: bytes) -> None:
        self._known[ikey] = time.monotonic()
        self._known.move_to_end(ikey)
        if len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    # -- existence (LOOKUP) -----------------------------------------------------------------
    def contains(self, ikey: bytes) -> bool:
        return self.contains_many([ikey])[0]

    def contains_many(self, ikeys: list[bytes]) -> list[bool]:
        """Whether each key is in the store. Keys being read or seen within ``KNOWN_TTL_S`` are
        answered here; the rest in **one** batched existence call (a LOOKUP of a 16k-token
        prompt on a node that never saw it asks about 512 keys: one call at a time held the
        loop for one store round trip each)."""
        out = [False] * len(ikeys)
        usable = self._usable()
        now = time.monotonic()
        ask: list[int] = []
        for i, ikey in enumerate(ikeys):
            if ikey in self._reads:
                out[i] = True
            elif not usable:
                continue
            elif now - self._known.get(ikey, -KNOWN_TTL_S) < KNOWN_TTL_S:
                out[i] = True
            else:
                ask.append(i)
        if not ask:
            return out
        names = [self._name(ikeys[i])[0] for i in ask]
        try:
            found = self._meta_call(lambda: self.t.exists_many(names), CONTAINS_TIMEOUT_S)
        except TransportError as exc:
            if exc.kind == "timeout":
                self.c["timeouts"] += 1
            what = names[0] if len(names) == 1 else f"{len(names)} keys"
            self._trouble(exc.kind, f"existence check of {what}: {exc}")
            return out
        self._latency("exists_ms", time.monotonic() - now)
        self.c["exists_calls"] += 1
        self.c["exists_keys"] += len(names)
        for i, hit in zip(ask, found, strict=True):
            out[i] = bool(hit)
            if hit:
                self._remember(ikeys[i])
            else:
                self._known.pop(ikeys[i], None)
        return out

    # -- reads (GET, PREWARM) ---------------------------------------------------------------
    def promote(self, ikey: bytes) -> Chunk | None:
        """Called by GET for a key that neither RAM nor a finished read could serve."""
        self.c["misses"] += 1
        return None

    def count_get(self, n: int, hits: int) -> None:
        """GET totals are counted by the server; this tier counts its own hits and misses."""

    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        """Read the RAM misses among ``ikeys`` from the store; True if ``on_ready`` will be
        called on the loop thread once they are in the arena, failed, or the deadline passed."""
        if not self._usable() or self._stalled():
            return False
        ikeys = list(ikeys)
        waiter = Waiter(on_ready, time.monotonic() + FETCH_TIMEOUT_S)
        self._request(ikeys, waiter)
        if waiter.left == 0:
            return False
        ram = self.store.index
        for ikey in ikeys:  # what RAM holds now must still be there when the reply is built
            chunk = ram.get(ikey)
            if chunk is not None:
                chunk.pins += 1
                waiter.pinned.append(chunk)
        waiter.armed = True
        self._waiters.append(waiter)
        return True

    def _stalled(self) -> bool:
        """True while a read has been under way longer than a GET may wait: the store hangs
        (a stopped master still accepts connections), so new GETs do not wait for it."""
        oldest = next(iter(self._reads.values()), None)
        return oldest is not None and time.monotonic() - oldest.started > FETCH_TIMEOUT_S

    def prewarm(self, ikeys: list[bytes]) -> int:
        if not self._usable():
            return 0
        return self._request(ikeys, None)

    def _request(self, ikeys: Iterable[bytes], waiter: Waiter | None) -> int:
        n = 0
        store = self.store
        for ikey in ikeys:
            if ikey in store.index or (ikey in store.pending and ikey not in self._reads):
                continue  # in RAM, or being written by a client
            job = self._reads.get(ikey)
            if job is None:
                name, digest, _ = self._name(ikey)
                job = ReadJob(ikey, name, digest)
                self._reads[ikey] = job
                self._readers.submit(job)
            if waiter is not None:
                job.waiters.append(waiter)
                waiter.left += 1
            n += 1
        return n

    def _reserve(self, job: ReadJob, length: int, box: list[Chunk | None], ev: threading.Event) -> None:
        """Loop thread: room in the arena for a value being read (invisible until published)."""
        if job.chunk is not None:  # the transport asks again with the right size
            self.store.cancel_hidden(job.chunk)
            job.chunk = None
        chunk = None
        if not job.cancelled:
            chunk = self.store.reserve_hidden(job.ikey, length)
            if chunk is None and job.ikey not in self.store.index:
                self.c["promotion_no_room"] += 1
        job.chunk = chunk
        box[0] = chunk
        ev.set()

    def _read_job(self, job: ReadJob) -> None:
        outcome: str = "ok"
        detail: Any = None
        t0 = time.monotonic()

        def alloc(length: int) -> Region | None:
            box: list[Chunk | None] = [None]
            ev = threading.Event()
            self.server.call_soon(lambda: self._reserve(job, length, box, ev))
            if not ev.wait(10.0) or box[0] is None:
                return None
            chunk = box[0]
            return Region(self._arena[chunk.offset : chunk.offset + length], self._arena_ptr + chunk.offset)

        i, slot = self._slot()
        region: Region | None = None
        try:
            region = self.t.fetch(job.name, slot, alloc)
            if region is None:
                outcome = "no_room"
            else:
                verify(slot.view, region.view, job.digest, job.ikey[2:])
        except TransportError as exc:
            outcome, detail = ("missing" if exc.kind == "missing" else "error"), exc
            if exc.kind == "corrupt":
                outcome = "corrupt"
        except cf.ChunkFileError as exc:
            outcome, detail = "corrupt", exc
        except Exception as exc:
            log.exception("%s long tier: read failed", self.backend)
            outcome, detail = "error", TransportError(f"{type(exc).__name__}: {exc}")
        finally:
            if region is not None:
                region.view.release()
            self._free_slots.put(i)
        elapsed = time.monotonic() - t0
        self.server.call_soon(lambda: self._read_done(job, outcome, detail, elapsed))

    def _read_done(self, job: ReadJob, outcome: str, detail: Any, elapsed: float) -> None:
        chunk = job.chunk
        ok = outcome == "ok" and chunk is not None and not job.cancelled
        if ok:
            assert chunk is not None
            self.store.publish(chunk)
            self._latency("read_ms", elapsed)
            self.c["bytes_read"] += chunk.length
            self.c["hits" if job.waiters else "prewarmed"] += 1
            self._remember(job.ikey)
        else:
            if chunk is not None:
                self.store.cancel_hidden(chunk)
            if outcome == "missing":
                self._known.pop(job.ikey, None)
            elif outcome == "corrupt":
                self._corrupt(job, str(detail))
            elif outcome == "error":
                self.c["failed_reads"] += 1
                self._trouble(detail.kind, f"read of {job.name} failed: {detail}")
        self._finish(job, chunk if ok else None)

    def _corrupt(self, job: ReadJob, why: str) -> None:
        self.c["corrupt_chunks"] += 1
        self.store.c["corrupt_chunks_total"] = self.store.c.get("corrupt_chunks_total", 0) + 1
        self.last_error = f"corrupt chunk {job.name}: {why}"
        self._known.pop(job.ikey, None)
        if self.c["corrupt_chunks"] <= LOG_MAX:
            log.warning(
                "%s long tier: corrupt chunk %s (%s), served as a miss and removed",
                self.backend,
                job.name,
                why,
            )
        self._submit_write(job.ikey, ("remove", job.name))

    def _finish(self, job: ReadJob, chunk: Chunk | None) -> None:
        if self._reads.get(job.ikey) is job:
            del self._reads[job.ikey]
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

    def _fire_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            self._fire(w)

    # -- deletes ----------------------------------------------------------------------------
    def delete(self, ikeys: list[bytes]) -> int:
        """Forget ``ikeys`` and remove them from the store (in the background: answers 0)."""
        for ikey in ikeys:
            job = self._writes.pop(ikey, None)
            if job is not None:
                job.cancelled = True
            read = self._reads.get(ikey)
            if read is not None:
                read.cancelled = True
            self._backlog.pop(ikey, None)
            self._known.pop(ikey, None)
            if self._usable():
                self._submit_write(ikey, ("remove", self._name(ikey)[0]))
        return 0

    # -- housekeeping -----------------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        if self._waiters:
            keep = []
            for w in self._waiters:
                if w.fired:
                    continue
                if now >= w.deadline:
                    self.c["timeouts"] += 1
                    self._trouble(
                        "timeout", f"reads did not finish within {FETCH_TIMEOUT_S:.0f} s; answered as misses"
                    )
                    self._fire(w)
                else:
                    keep.append(w)
            self._waiters = keep
        self._update_state()
        self._drain_backlog()

    def stats(self) -> dict[str, Any]:
        state = self.state
        return {
            "backend": self.backend,
            "state": state,
            "connected": state in ("ready", "degraded"),
            "endpoint": self.t.endpoint,
            "chunks": self.chunks,
            "bytes_used": self.bytes_used,
            "capacity": 0,
            "queued_writes": self.queued,
            "backlog": len(self._backlog),
            "reads_in_flight": len(self._reads),
            "index_load_s": None,
            "last_error": self.last_error,
            "latency_ms": self.latency["read_ms"]
            if self.latency["read_ms"] is not None
            else self.latency["write_ms"],
            "read_latency_ms": self.latency["read_ms"],
            "write_latency_ms": self.latency["write_ms"],
            "exists_latency_ms": self.latency["exists_ms"],
            **self.c,
        }

    def close(self) -> None:
        """Finish queued writes (bounded wait), stop the threads, then close the client before
        the arena it registered is unmapped."""
        self._backlog.clear()
        self._fire_all()
        if not self._writers.close(timeout=10.0):
            log.warning(
                "%s long tier: writes still running at shutdown; their chunks may be missing", self.backend
            )
        self._readers.close(timeout=3.0)
        if not self._stop_link():
            log.warning("%s long tier: a client call is still blocked at shutdown", self.backend)
            return  # closing the client under a running call can crash the process
        try:
            self.t.close()
        except Exception as exc:
            log.warning("%s long tier: closing the client failed: %s", self.backend, exc)


__all__ = ["HEADER", "Region", "RemoteTier", "Transport", "TransportError", "verify"]
