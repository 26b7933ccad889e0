"""The chunk index of the RAM tier: placement, retention classes, leases and eviction.

Ownership rules (each one sentence, in the manner of Plasma's create/seal/get/release):

* A reservation belongs to the connection that made it; it is invisible until sealed, and is
  freed if that connection aborts it or dies.
* A sealed chunk belongs to the daemon; readers see it only through a lease.
* A lease belongs to the connection that took it and pins the chunk's bytes until released or
  the connection dies; a leased chunk is never evicted or overwritten in place.
* A chunk removed from the index while leased (delete, overwrite) becomes a zombie: invisible,
  and freed when its last lease goes.

Eviction order: expired ``ephemeral`` chunks, then least-recently-used ``ephemeral``, then
``short``, then ``long``; chunks that are leased, held by a LOOKUP, or being written to the long
tier are skipped.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from infera.kvd.arena import Allocator, align_up
from infera.kvd.namespaces import Namespaces
from infera.kvd.protocol import RETENTION_CODE, RETENTIONS

NONE, EPHEMERAL, SHORT, LONG = (RETENTION_CODE[r] for r in RETENTIONS)
EVICTION_ORDER = (EPHEMERAL, SHORT, LONG)


class Chunk:
    """One chunk: a region of the arena plus its policy state."""

    __slots__ = (
        "expires",
        "hold_until",
        "ikey",
        "last_access",
        "leases",
        "length",
        "offset",
        "on_long",
        "pins",
        "retention",
        "sealed",
        "zombie",
    )

    def __init__(self, ikey: bytes, offset: int, length: int, retention: int) -> None:
        self.ikey = ikey
        self.offset = offset
        self.length = length
        self.retention = retention
        self.sealed = False
        self.zombie = False
        self.leases = 0
        self.pins = 0  # internal holds (e.g. a long-tier write reading the bytes)
        self.hold_until = 0.0
        self.expires = 0.0
        self.last_access = 0.0
        self.on_long = False

    @property
    def ns_id(self) -> int:
        return int.from_bytes(self.ikey[:2], "big")

    @property
    def key(self) -> bytes:
        return self.ikey[2:]

    def evictable(self, now: float) -> bool:
        return self.leases == 0 and self.pins == 0 and self.hold_until <= now


class ReserveResult:
    __slots__ = ("chunk", "error")

    def __init__(self, chunk: Chunk | None, error: str | None = None) -> None:
        self.chunk = chunk
        self.error = error


class Store:
    """Index and policy of the RAM tier. Single-threaded: the server loop owns it."""

    def __init__(
        self,
        capacity: int,
        ephemeral_ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alloc = Allocator(capacity)
        self.ephemeral_ttl = ephemeral_ttl
        self.clock = clock
        self.index: dict[bytes, Chunk] = {}
        self.pending: dict[bytes, Chunk] = {}
        self.lru: dict[int, OrderedDict[bytes, Chunk]] = {c: OrderedDict() for c in EVICTION_ORDER}
        self.ns = Namespaces()  # ids are counted and reused (see infera.kvd.namespaces)
        self.namespaces: dict[str, int] = self.ns.ids
        self.ns_names: list[str] = self.ns.names
        self.bytes_stored = 0
        # Hooks the long tier installs (see tiers/): called with the chunk.
        self.on_seal: Callable[[Chunk], None] | None = None
        self.on_drop: Callable[[Chunk, str], None] | None = None
        self.c: dict[str, int] = dict.fromkeys(
            (
                "sets_total",
                "gets_total",
                "hits_total",
                "misses_total",
                "evictions_total",
                "expired_total",
                "deletes_total",
                "lookups_total",
                "lookup_keys_total",
                "lookup_hit_keys_total",
                "bytes_in_total",
                "bytes_out_total",
                "put_rejected_total",
                "put_rejected_full_total",
                "put_none_total",
                "put_exists_total",
                "put_busy_total",
                "aborts_total",
            ),
            0,
        )
        self.evictions_by_class: dict[str, int] = {RETENTIONS[c]: 0 for c in EVICTION_ORDER}

    # -- namespaces -------------------------------------------------------------------------
    def ns_id(self, name: str) -> int:
        """The id of namespace ``name``, counted as held once more until ``self.ns.release``.
        Raises ValueError when every id is in use."""
        return self.ns.acquire(name, lambda: itertools.chain(self.index, self.pending))

    @staticmethod
    def ikey(ns: int, key: bytes) -> bytes:
        return ns.to_bytes(2, "big") + key

    # -- writers ----------------------------------------------------------------------------
    def reserve(self, ikey: bytes, length: int, retention: int, overwrite: bool = False) -> ReserveResult:
        """Reserve ``length`` bytes for ``ikey``. Errors: none/exists/busy/full/too_large."""
        if retention == NONE:
            self.c["put_none_total"] += 1
            return ReserveResult(None, "none")
        if not overwrite and ikey in self.index:
            self.c["put_exists_total"] += 1
            self.touch(self.index[ikey])
            return ReserveResult(None, "exists")
        if ikey in self.pending:
            self.c["put_busy_total"] += 1
            return ReserveResult(None, "busy")
        if align_up(length) > self.alloc.capacity:
            self.c["put_rejected_total"] += 1
            return ReserveResult(None, "too_large")
        off = self._alloc_evicting(length)
        if off is None:
            self.c["put_rejected_total"] += 1
            self.c["put_rejected_full_total"] += 1
            return ReserveResult(None, "full")
        chunk = Chunk(ikey, off, length, retention)
        self.pending[ikey] = chunk
        return ReserveResult(chunk)

    def seal(self, chunk: Chunk) -> bool:
        """Make a reservation visible. Returns False if another writer won meanwhile."""
        if self.pending.get(chunk.ikey) is chunk:
            del self.pending[chunk.ikey]
        old = self.index.get(chunk.ikey)
        if old is not None:
            self._unlink(old, "overwrite")
        now = self.clock()
        chunk.sealed = True
        chunk.last_access = now
        if chunk.retention == EPHEMERAL:
            chunk.expires = now + self.ephemeral_ttl
        self.index[chunk.ikey] = chunk
        self.lru[chunk.retention][chunk.ikey] = chunk
        self.bytes_stored += chunk.length
        self.c["sets_total"] += 1
        self.c["bytes_in_total"] += chunk.length
        if self.on_seal is not None:
            self.on_seal(chunk)
        return True

    def abort(self, chunk: Chunk) -> None:
        """Drop an unsealed reservation (explicit ABORT or its connection died)."""
        if self.pending.get(chunk.ikey) is chunk:
            del self.pending[chunk.ikey]
        self.c["aborts_total"] += 1
        self.alloc.free(chunk.offset, chunk.length)

    def insert_sealed(self, ikey: bytes, length: int, retention: int, on_long: bool) -> Chunk | None:
        """Allocate and register a chunk whose bytes the caller fills before using it (promotion)."""
        off = self._alloc_evicting(length)
        if off is None:
            return None
        chunk = Chunk(ikey, off, length, retention)
        chunk.sealed = True
        chunk.on_long = on_long
        chunk.last_access = self.clock()
        if retention == EPHEMERAL:
            chunk.expires = chunk.last_access + self.ephemeral_ttl
        self.index[ikey] = chunk
        self.lru[retention][ikey] = chunk
        self.bytes_stored += length
        return chunk

    # Asynchronous promotion (the disk tier reads in threads): room first, invisible and
    # uncounted like a reservation (a writer of the same key gets ``busy``), published once filled.
    def reserve_hidden(self, ikey: bytes, length: int) -> Chunk | None:
        """Room for a ``long`` chunk being read back; None if the key is present or being written,
        or if the arena cannot make room."""
        if ikey in self.index or ikey in self.pending or align_up(length) > self.alloc.capacity:
            return None
        off = self._alloc_evicting(length)
        if off is None:
            return None
        chunk = Chunk(ikey, off, length, LONG)
        chunk.on_long = True
        self.pending[ikey] = chunk
        return chunk

    def publish(self, chunk: Chunk) -> None:
        """Make a chunk from :meth:`reserve_hidden` visible, once its bytes are in place."""
        if self.pending.get(chunk.ikey) is chunk:
            del self.pending[chunk.ikey]
        chunk.sealed = True
        chunk.last_access = self.clock()
        self.index[chunk.ikey] = chunk
        self.lru[chunk.retention][chunk.ikey] = chunk
        self.bytes_stored += chunk.length

    def cancel_hidden(self, chunk: Chunk) -> None:
        """Give back the room of a :meth:`reserve_hidden` chunk whose read failed."""
        if self.pending.get(chunk.ikey) is chunk:
            del self.pending[chunk.ikey]
        self.alloc.free(chunk.offset, chunk.length)

    # -- readers ----------------------------------------------------------------------------
    def find(self, ikey: bytes) -> Chunk | None:
        chunk = self.index.get(ikey)
        if chunk is not None and chunk.retention == EPHEMERAL and chunk.expires <= self.clock():
            self._expire(chunk)
            return None
        return chunk

    def count_present(self, ikeys: list[bytes], hold_s: float = 0.0) -> tuple[int, int]:
        """LOOKUP's hot loop: how many of ``ikeys`` are in RAM counting from the first.

        Found chunks are touched (and held for ``hold_s``). Returns ``(count, stop)`` where
        ``stop`` is the index of the first key not in RAM (== count), so a long tier can continue
        the count from there."""
        index = self.index
        lrus = self.lru
        now = self.clock()
        hold_until = now + hold_s
        n = 0
        for ikey in ikeys:
            chunk = index.get(ikey)
            if chunk is None or (chunk.retention == EPHEMERAL and chunk.expires <= now):
                break
            chunk.last_access = now
            lrus[chunk.retention].move_to_end(ikey)
            if hold_s and chunk.hold_until < hold_until:
                chunk.hold_until = hold_until
            n += 1
        return n, n

    def touch(self, chunk: Chunk) -> None:
        chunk.last_access = self.clock()
        lru = self.lru[chunk.retention]
        if chunk.ikey in lru:
            lru.move_to_end(chunk.ikey)

    def lease(self, chunk: Chunk) -> None:
        chunk.leases += 1
        self.touch(chunk)
        self.c["bytes_out_total"] += chunk.length

    def release(self, chunk: Chunk) -> None:
        chunk.leases -= 1
        if chunk.zombie and chunk.leases == 0 and chunk.pins == 0:
            self.alloc.free(chunk.offset, chunk.length)

    def unpin(self, chunk: Chunk) -> None:
        chunk.pins -= 1
        if chunk.zombie and chunk.leases == 0 and chunk.pins == 0:
            self.alloc.free(chunk.offset, chunk.length)

    def hold(self, chunk: Chunk, seconds: float) -> None:
        chunk.hold_until = max(chunk.hold_until, self.clock() + seconds)

    # -- removal ----------------------------------------------------------------------------
    def delete(self, ikeys: Iterable[bytes]) -> int:
        n = 0
        for ikey in ikeys:
            chunk = self.index.get(ikey)
            if chunk is not None:
                self._unlink(chunk, "delete")
                n += 1
        self.c["deletes_total"] += n
        return n

    def _unlink(self, chunk: Chunk, reason: str) -> None:
        del self.index[chunk.ikey]
        self.lru[chunk.retention].pop(chunk.ikey, None)
        self.bytes_stored -= chunk.length
        if self.on_drop is not None:
            self.on_drop(chunk, reason)
        if chunk.leases or chunk.pins:
            chunk.zombie = True
        else:
            self.alloc.free(chunk.offset, chunk.length)

    def _expire(self, chunk: Chunk) -> None:
        self.c["expired_total"] += 1
        self._unlink(chunk, "expired")

    def sweep(self) -> int:
        """Expire ephemeral chunks whose TTL has passed; returns how many went."""
        now = self.clock()
        gone = [c for c in self.lru[EPHEMERAL].values() if c.expires <= now and c.evictable(now)]
        for chunk in gone:
            self._expire(chunk)
        return len(gone)

    def _next_victim(self, cls: int, now: float) -> Chunk | None:
        for chunk in self.lru[cls].values():
            if chunk.evictable(now):
                return chunk
        return None

    def _alloc_evicting(self, length: int) -> int | None:
        off = self.alloc.alloc(length)
        if off is not None:
            return off
        now = self.clock()
        self.sweep()
        off = self.alloc.alloc(length)
        if off is not None:
            return off
        for cls in EVICTION_ORDER:
            while (victim := self._next_victim(cls, now)) is not None:
                self.c["evictions_total"] += 1
                self.evictions_by_class[RETENTIONS[victim.retention]] += 1
                self._unlink(victim, "evicted")
                off = self.alloc.alloc(length)
                if off is not None:
                    return off
        return None

    # -- reporting --------------------------------------------------------------------------
    def chunks_by_class(self) -> dict[str, int]:
        return {RETENTIONS[c]: len(self.lru[c]) for c in EVICTION_ORDER}

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.c,
            "chunks": len(self.index),
            "reservations": len(self.pending),
            "arena_bytes_used": self.alloc.used,
            "arena_bytes_capacity": self.alloc.capacity,
            "arena_bytes_stored": self.bytes_stored,
            "arena_free_extents": self.alloc.extents,
            "arena_largest_free": self.alloc.largest_free,
            "chunks_by_class": self.chunks_by_class(),
            "evictions_by_class": dict(self.evictions_by_class),
        }
