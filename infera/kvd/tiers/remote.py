"""L4: the distributed long tier, shared by the ``mooncake`` and ``lmcache`` backends.

A backend is a :class:`Transport` (put, get, exists, remove against one store); the shared
pipelines (:mod:`.pipeline`, :mod:`.promotions`) do the write-through, retries and reads, and
this module what only a shared store needs, so both backends behave the same way:

* Values are chunk files: the 4 KiB header of :mod:`infera.kvd.chunkfile` (key, namespace digest,
  payload length, checksums) followed by the payload. A value read back is verified exactly like
  a disk chunk; a bad one is counted in ``corrupt_chunks``, served as a miss and removed from the
  store so a writer can replace it.
* Names are a pure function of (namespace text, key), never of the daemon's own namespace ids, so
  every daemon that serves a namespace finds the chunks the others wrote (the formulas are in
  :mod:`infera.kvd.keyspace`).
* A GET that misses RAM is deferred while reader threads copy the value into the arena; it is
  answered within ``FETCH_TIMEOUT_S`` whatever the store does. LOOKUP asks the store whether the
  keys exist in one batched call and waits at most ``CONTAINS_TIMEOUT_S``; keys seen within
  ``KNOWN_TTL_S`` are answered from memory.
* A monitor thread probes the store every second and (re)connects (:mod:`.l4link`). While the
  store is unreachable the tier is ``disconnected``: no call is made at all, writes go to the
  backlog, deferred GETs are answered at once. After a reconnect the ``long`` chunks RAM holds
  are written again (a Mooncake master restart loses every key). A write refused for lack of
  room or of the store pauses writes for ``PAUSE_S``; failed writes are retried with back-off.
"""

from __future__ import annotations

import logging
import mmap
import queue
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from infera.kvd import chunkfile as cf
from infera.kvd.keyspace import Namespace, key_of
from infera.kvd.store import LONG, Chunk
from infera.kvd.tiers.l4link import Link
from infera.kvd.tiers.pipeline import WriteJob, WriteThrough
from infera.kvd.tiers.promotions import OK, Promotions, ReadJob
from infera.kvd.tiers.transport import HEADER, Region, Transport, TransportError, buffer_address, verify

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.tiers.base import LongTier, TierHost

log = logging.getLogger("infera.kvd.l4")

READERS = 2
FETCH_TIMEOUT_S = 2.0
WRITE_TIMEOUT_S = 5.0  # a write under way longer is stuck: the tier is degraded (a 4 MiB put takes ms)
CONTAINS_TIMEOUT_S = 0.25
KNOWN_TTL_S = 2.0
KNOWN_MAX = 65536
PAUSE_S = 2.0  # after a write failed for lack of room or of the store, writes wait this long
STOP_BUDGET_S = 10.0  # a clean stop's last attempt at unwritten chunks


def _kind(err: BaseException) -> str:
    return err.kind if isinstance(err, TransportError) else "error"


class RemoteTier(Link):
    """A distributed long tier over ``transport`` (a :class:`~.base.LongTier`)."""

    backend = "?"
    log = log

    def __init__(self, cfg: DaemonConfig, host: TierHost, transport: Transport) -> None:
        self.store = store = host.store
        self.ns = store.ns  # the namespace table: id -> Namespace
        self._arena = host.arena.view
        self._arena_ptr = buffer_address(host.arena.map)
        nslots = max(1, cfg.long_writers) + READERS + 1
        self._slot_map = mmap.mmap(-1, nslots * HEADER)
        self._slot_ptr = buffer_address(self._slot_map)
        self._slot_view = memoryview(self._slot_map)
        self._free_slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(nslots):
            self._free_slots.put(i)
        self._known: OrderedDict[bytes, float] = OrderedDict()  # ikey -> when the store had it
        self._pause_until = 0.0
        self.chunks = 0
        self.bytes_used = 0
        counters = dict.fromkeys(
            (
                *("hits", "misses", "bytes_read", "bytes_written", "chunks_written", "corrupt_chunks"),
                *("failed_writes", "failed_reads", "dropped_writes", "backpressure", "timeouts", "errors"),
                *("prewarmed", "promotion_no_room", "removed", "resynced", "state_changes", "disconnects"),
                *("reconnects", "exists_calls", "exists_keys"),
            ),
            0,
        )
        super().__init__(host, transport, counters)
        self.writes = WriteThrough(host, self, "l4-write", cfg.long_writers, cfg.long_write_queue, 1.0)
        self.reads = Promotions(host, self, "l4-read", READERS, deadline_s=FETCH_TIMEOUT_S)
        self._start_link()

    @property
    def label(self) -> str:
        return f"{self.backend} long tier"

    def _regions(self) -> tuple[Region, Region]:
        return Region(self._arena, self._arena_ptr), Region(self._slot_view, self._slot_ptr)

    def _reconnected(self) -> None:
        self._resync()

    def _disconnected(self) -> None:
        self.reads.fire_all()

    # -- names ------------------------------------------------------------------------------
    def _name(self, ikey: bytes, ns: Namespace | None = None) -> str:
        return self.t.name((ns or self.ns.of(ikey)).digest, key_of(ikey))

    def _resync(self) -> None:
        """After the store was unreachable (a Mooncake master restart loses every key), write
        the ``long`` chunks RAM still holds again; the backlog feeds the writers as they drain."""
        self._known.clear()
        self.chunks = 0
        self.bytes_used = 0
        n = self.writes.rewrite(chunk for _ikey, chunk in self.store.chunks_of(LONG))
        self.c["resynced"] += n
        if n:
            log.info("%s: rewriting %d chunks held in RAM after reconnecting", self.label, n)

    def _remember(self, ikey: bytes) -> None:
        self._known[ikey] = time.monotonic()
        self._known.move_to_end(ikey)
        if len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    def _slot(self) -> tuple[int, Region]:
        i = self._free_slots.get()
        return i, Region(self._slot_view[i * HEADER : (i + 1) * HEADER], self._slot_ptr + i * HEADER)

    # -- writes (the WriteThrough hooks) ------------------------------------------------------
    def address(self, chunk: Chunk, ns: Namespace) -> str:
        return self._name(chunk.ikey, ns)

    def accepting(self) -> bool:
        return self._usable() and time.monotonic() >= self._pause_until

    def admitted(self, job: WriteJob) -> None:
        pass  # the store keeps its own room

    def write(self, job: WriteJob) -> TransportError | None:
        """Writer thread: header from a registered slot, payload straight from the arena."""
        chunk = job.chunk
        i, slot = self._slot()
        view = self._arena[chunk.offset : chunk.offset + chunk.length]
        try:
            header = cf.make_header(job.ns.digest, chunk.key, view, namespace_text=job.ns.text)
            slot.view[:] = header.pack()
            self.t.put(job.where, slot, Region(view, self._arena_ptr + chunk.offset), job.replace)
        except TransportError as exc:
            return exc
        finally:
            view.release()
            self._free_slots.put(i)
        return None

    def landed(self, job: WriteJob) -> None:
        self._latency("write_ms", job.elapsed)
        self.c["bytes_written"] += job.size
        self.c["chunks_written"] += 1
        self.chunks += 1
        self.bytes_used += job.size
        self._remember(job.chunk.ikey)

    def failed(self, job: WriteJob, err: Exception) -> None:
        kind = _kind(err)
        if kind == "full":
            self.c["backpressure"] += 1
            self._trouble("full", f"store full, write of {job.where} postponed: {err}")
        else:
            self.c["failed_writes"] += 1
            self._trouble(kind, f"write of {job.where} failed: {err}")
        if kind in ("full", "down"):
            # No room (the master evicts asynchronously; right after a master restart the storage
            # nodes have not remounted yet) or no store: every write waits a little.
            self._pause_until = time.monotonic() + PAUSE_S

    def _remove(self, ikey: bytes, name: str) -> None:
        """Remove ``name`` from the store, on its writer lane (after its queued writes)."""

        def remove() -> None:
            err: TransportError | None = None
            ok = False
            try:
                ok = self.t.remove(name)
            except TransportError as exc:
                err = exc
            self.host.call_soon(lambda: self._removed(name, ok, err))

        self.writes.after(name, remove)

    def _removed(self, name: str, ok: bool, err: TransportError | None) -> None:
        if err is not None:
            self._trouble(err.kind, f"remove {name}: {err}")
        elif ok:
            self.c["removed"] += 1

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
            if ikey in self.reads.jobs:
                out[i] = True
            elif not usable:
                continue
            elif now - self._known.get(ikey, -KNOWN_TTL_S) < KNOWN_TTL_S:
                out[i] = True
            else:
                ask.append(i)
        if not ask:
            return out
        names = [self._name(ikeys[i]) for i in ask]
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

    # -- reads (the Promotions hooks; GET, PREWARM) ---------------------------------------------
    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        """Nothing to wait for while the store is unreachable, or while a read has been under way
        longer than a GET may wait (the store hangs: a stopped master still accepts connections)."""
        if not self._usable() or self.reads.stalled(FETCH_TIMEOUT_S):
            return False
        return self.reads.fetch(ikeys, on_ready)

    def prewarm(self, ikeys: list[bytes]) -> int:
        return self.reads.request(ikeys, None, urgent=False) if self._usable() else 0

    def count_misses(self, n: int) -> None:
        self.c["misses"] += n

    def locate(self, ikey: bytes, ns: Namespace) -> tuple[str, None]:
        return self._name(ikey, ns), None  # the store knows; the length comes with the value

    def start(self, job: ReadJob) -> tuple[str, Any]:
        """Reader thread: the header into a registered slot, the payload into arena room the
        loop reserves once the transport knows its size; verified before anyone sees it."""

        def alloc(length: int) -> Region | None:
            chunk = self.reads.room(job, length)
            if chunk is None:
                return None
            return Region(self._arena[chunk.offset : chunk.offset + length], self._arena_ptr + chunk.offset)

        i, slot = self._slot()
        region: Region | None = None
        try:
            region = self.t.fetch(job.where, slot, alloc)
            if region is None:
                return "no_room", None
            verify(slot.view, region.view, job.ns.digest, key_of(job.ikey))
        except TransportError as exc:
            return (
                "missing" if exc.kind == "missing" else "corrupt" if exc.kind == "corrupt" else "error"
            ), exc
        except cf.ChunkFileError as exc:
            return "corrupt", exc
        finally:
            if region is not None:
                region.view.release()
            self._free_slots.put(i)
        return OK, None

    def promoted(self, job: ReadJob) -> None:
        self._latency("read_ms", job.elapsed)
        self._remember(job.ikey)

    def read_failed(self, job: ReadJob, outcome: str, detail: Any) -> None:
        if outcome in ("missing", "corrupt"):
            self._known.pop(job.ikey, None)
        if outcome == "corrupt":
            self.reads.corrupt(f"{job.where}: {detail}", "served as a miss and removed")
            self._remove(job.ikey, job.where)
        elif outcome == "error":
            self.c["failed_reads"] += 1
            self._trouble(_kind(detail), f"read of {job.where} failed: {detail}")

    # -- deletes ----------------------------------------------------------------------------
    def delete(self, ikeys: list[bytes]) -> int:
        """Forget ``ikeys`` and remove them from the store (in the background: answers 0)."""
        for ikey in ikeys:
            self.writes.cancel(ikey)
            self.reads.cancel(ikey)
            self._known.pop(ikey, None)
            if self._usable():
                self._remove(ikey, self._name(ikey))
        return 0

    # -- housekeeping -----------------------------------------------------------------------
    def tick(self) -> None:
        for _ in range(self.reads.expire()):
            self.c["timeouts"] += 1
            self._trouble(
                "timeout", f"reads did not finish within {FETCH_TIMEOUT_S:.0f} s; answered as misses"
            )
        stuck, new = self.writes.stuck(WRITE_TIMEOUT_S)
        if new:
            self.c["timeouts"] += new
            self._trouble("timeout", f"writes stuck: {stuck} under way for over {WRITE_TIMEOUT_S:.0f} s")
        if stuck or self.reads.stalled(FETCH_TIMEOUT_S):
            self.trouble_at = time.monotonic()  # degraded for as long as work is stuck
        self._update_state()
        self.writes.tick()

    def read_rate(self) -> float | None:
        return self.reads.read_gbps

    def stats(self) -> dict[str, Any]:
        state = self.state
        read_ms = self.latency["read_ms"]
        return {
            "backend": self.backend,
            "state": state,
            "connected": state in ("ready", "degraded"),
            "endpoint": self.t.endpoint,
            "chunks": self.chunks,
            "bytes_used": self.bytes_used,
            "capacity": 0,
            **self.writes.stats(),
            "reads_in_flight": len(self.reads.jobs),
            **self.reads.stats(),
            "index_load_s": None,
            "last_error": self.last_error,
            "latency_ms": read_ms if read_ms is not None else self.latency["write_ms"],
            "read_latency_ms": read_ms,
            "write_latency_ms": self.latency["write_ms"],
            "exists_latency_ms": self.latency["exists_ms"],
            **self.c,
        }

    def close(self) -> None:
        """Answer waiting GETs, make the last attempt at unwritten chunks, stop the threads, then
        close the client before the arena it registered is unmapped."""
        self.reads.fire_all()
        self.writes.stop(STOP_BUDGET_S)
        self.reads.close(timeout=3.0)
        if not self._stop_link():
            log.warning("%s: a client call is still blocked at shutdown", self.label)
            return  # closing the client under a running call can crash the process
        try:
            self.t.close()
        except Exception as exc:
            log.warning("%s: closing the client failed: %s", self.label, exc)


if TYPE_CHECKING:
    _contract: type[LongTier] = RemoteTier  # mypy holds the tier to what the server uses

__all__ = ["HEADER", "Region", "RemoteTier", "Transport", "TransportError", "verify"]
