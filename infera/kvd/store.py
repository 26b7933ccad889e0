"""The chunk index of the RAM tier: placement, retention classes, leases and eviction.

Ownership rules (each one sentence, in the manner of Plasma's create/seal/get/release):

* A reservation belongs to the connection that made it; it is invisible until sealed, and is
  freed if that connection aborts it or dies.
* A sealed chunk belongs to the daemon; readers see it only through a lease.
* A lease belongs to the connection that took it and pins the chunk's bytes until released or
  the connection dies; a leased chunk is never evicted or overwritten in place.
* A chunk removed from the index while leased (delete, overwrite) becomes a zombie: invisible,
  and freed when its last lease goes.

Eviction order: expired ``ephemeral`` chunks, then ``ephemeral``, then ``short``, then ``long``,
each class least recently used first by the CLOCK rule below; chunks that are leased, held by a
LOOKUP, or being written to the long tier are skipped.

The eviction queues (CLOCK, and the chunks set aside): :mod:`infera.kvd.evictq`.

How skipping stays cheap (refusing a write must cost O(keys), never O(keys x chunks)):

* When the victim scan meets a chunk it may not evict, it sets it aside in ``parked[cls]`` and
  never looks at it again while that lasts: a leased or pinned chunk comes back when its last lease or pin
  goes (:meth:`Store.release`, :meth:`Store.unpin`), a held one when its ``hold_until`` passes
  (a heap keyed by it, drained by :meth:`Store.sweep` and before every eviction). A chunk comes
  back at the most-recently-used end of its class, as if accessed when it stopped being in use
  (it was in use until then; an exact old position would cost a sorted structure on the hot path).
  An ``ephemeral`` chunk whose TTL passed while it was set aside expires when it comes back.
* ``ephemeral`` chunks are also kept in seal order, which is expiry order (one TTL, a monotonic
  clock), so :meth:`Store.sweep` looks only at the chunks that did expire.
* Within one PUT (:meth:`Store.reserve_many`), once a size found the arena full after evicting
  everything evictable, keys of that size or larger are refused ``full`` at once.

Every chunk is therefore visited by the victim scan at most once per spell of being in use, and
each refused key costs a few dict lookups.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from infera.kvd.arena import ALIGN, Allocator, align_up
from infera.kvd.chunk import (
    _FULL,
    _QUOTA,
    BUSY,
    EPHEMERAL,
    EVICTION_ORDER,
    GONE,
    HELD,
    IN_LRU,
    LONG,
    NONE,
    SHORT,
    Chunk,
    ReserveResult,
    unlink_chain,
)
from infera.kvd.evictq import EvictionQueues
from infera.kvd.flatindex import FlatIndex
from infera.kvd.namespaces import NamespaceTable
from infera.kvd.protocol import RETENTIONS
from infera.kvd.readers import Readers


class Store(EvictionQueues, Readers):
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
        self.index = FlatIndex()  # ikey -> sealed chunk, with each one's access bit and hold
        self.pending: dict[bytes, Chunk] = {}
        # eviction candidates, oldest first (CLOCK, see the module docstring), with their stale
        # entries counted; the chunks the scan set aside; indexed chunks per class
        self.lru: dict[int, deque[Chunk]] = {c: deque() for c in EVICTION_ORDER}
        self.stale: dict[int, int] = dict.fromkeys(EVICTION_ORDER, 0)
        self.parked: dict[int, dict[bytes, Chunk]] = {c: {} for c in EVICTION_ORDER}
        self._count: dict[int, int] = dict.fromkeys(EVICTION_ORDER, 0)
        self._held: list[tuple[float, int, Chunk]] = []  # (hold_until, seq, chunk) of HELD chunks
        self._held_n = 0  # chunks parked HELD (the heap may also hold stale entries)
        self._seq = itertools.count()
        self._by_expiry: OrderedDict[bytes, Chunk] = OrderedDict()  # ephemeral, in seal order
        self._full_at: int | None = None  # within reserve_many: smallest size refused "full"
        # id <-> name and the Namespace (text, digest) of an id, for the ops and the long tiers;
        # ids are counted and reused (see infera.kvd.namespaces)
        self.ns = NamespaceTable()
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
                "put_rejected_quota_total",
                "holds_refused_quota_total",
                "put_none_total",
                "put_exists_total",
                "put_busy_total",
                "put_rolled_back_total",
                "aborts_total",
                "evict_skipped_total",
            ),
            0,
        )
        self.evictions_by_class: dict[str, int] = {RETENTIONS[c]: 0 for c in EVICTION_ORDER}

    # -- namespaces -------------------------------------------------------------------------
    def ns_id(self, name: str) -> int:
        """The id of namespace ``name``, counted as held once more until ``self.ns.release``.
        Raises ValueError when every id is in use."""
        return self.ns.acquire(name, lambda: itertools.chain(self.index, self.pending))

    # -- writers ----------------------------------------------------------------------------
    def reserve(
        self, ikey: bytes, length: int, retention: int, overwrite: bool = False, room: int | None = None
    ) -> ReserveResult:
        """Reserve ``length`` bytes for ``ikey``. Errors: none/exists/busy/too_large/quota/full.
        ``room``: the bytes the caller's connection may still pin (:mod:`infera.kvd.budget`)."""
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
        size = align_up(max(length, 1))
        if size > self.alloc.capacity:
            self.c["put_rejected_total"] += 1
            return ReserveResult(None, "too_large")
        if room is not None and length > room:
            self.c["put_rejected_total"] += 1
            self.c["put_rejected_quota_total"] += 1
            return _QUOTA
        full_at = self._full_at
        off = None if full_at is not None and size >= full_at else self._alloc_evicting(length)
        if off is None:
            if full_at is not None and size < full_at:
                self._full_at = size
            self.c["put_rejected_total"] += 1
            self.c["put_rejected_full_total"] += 1
            return ReserveResult(None, "full")
        chunk = Chunk(ikey, off, length, retention)
        self.pending[ikey] = chunk
        return ReserveResult(chunk)

    def reserve_many(
        self,
        ikeys: Sequence[bytes],
        lengths: Sequence[int],
        retention: int,
        overwrite: bool = False,
        room: int | None = None,
        idle: bool = False,
    ) -> list[ReserveResult]:
        """A PUT's reservations, all or nothing: :meth:`reserve` for each key (the caller checked
        every argument first); if anything raises midway, the reservations this call made are
        given back before the exception goes on. Once a size found the arena full (everything
        evictable already evicted), keys of that size or larger in the same call are refused
        ``full`` at once: nothing in between frees room. ``room``: the bytes the connection may
        still pin, less each reservation made here; ``idle``: it pins nothing yet, so its first
        reservation may be larger than ``room`` (the quota never makes a chunk unwritable)."""
        out: list[ReserveResult] = []
        capacity = self.alloc.capacity
        self._full_at = capacity + ALIGN  # nothing refused yet: above any size that fits
        index = self.index
        pending = self.pending
        refused = 0
        try:
            for ikey, length in zip(ikeys, lengths, strict=True):
                # the tail of a batch that found the arena full: what reserve would answer, for
                # a few dict lookups (align_up(length) >= _full_at, both multiples of ALIGN)
                if (
                    self._full_at - ALIGN < length <= capacity
                    and (room is None or idle or length <= room)
                    and retention != NONE
                    and (overwrite or ikey not in index)
                    and ikey not in pending
                ):
                    out.append(_FULL)
                    refused += 1
                    continue
                allowed = max(room, length) if idle and room is not None else room
                res = self.reserve(ikey, length, retention, overwrite, allowed)
                if room is not None and res.chunk is not None:
                    room -= length
                    idle = False
                out.append(res)
        except BaseException:
            n = 0
            for res in out:
                if res.chunk is not None:
                    self.cancel_hidden(res.chunk)  # unseen and uncounted: just give the room back
                    n += 1
            self.c["put_rolled_back_total"] += n
            raise
        finally:
            self._full_at = None
            self.c["put_rejected_total"] += refused
            self.c["put_rejected_full_total"] += refused
        return out

    def seal(self, chunk: Chunk) -> bool:
        """Make a reservation visible. Returns False if another writer won meanwhile."""
        if self.pending.get(chunk.ikey) is chunk:
            del self.pending[chunk.ikey]
        old = self.index.get(chunk.ikey)
        if old is not None:
            self._unlink(old, "overwrite")
        now = self.clock()
        chunk.sealed = True
        if chunk.retention == EPHEMERAL:
            chunk.expires = now + self.ephemeral_ttl
            self._by_expiry[chunk.ikey] = chunk
        self.index[chunk.ikey] = chunk
        self._count[chunk.retention] += 1
        self._enqueue(chunk, new=True)
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
        self.index[chunk.ikey] = chunk
        self._count[chunk.retention] += 1
        self._enqueue(chunk, new=True)
        self.bytes_stored += chunk.length

    def cancel_hidden(self, chunk: Chunk) -> None:
        """Give back the room of a :meth:`reserve_hidden` chunk whose read failed."""
        if self.pending.get(chunk.ikey) is chunk:
            del self.pending[chunk.ikey]
        self.alloc.free(chunk.offset, chunk.length)

    # -- readers ----------------------------------------------------------------------------
    def touch(self, chunk: Chunk) -> None:
        self.index.set_ref(chunk)  # (set aside: it goes back to the young end anyway)

    def lease(self, chunk: Chunk) -> None:
        chunk.leases += 1
        self.touch(chunk)
        self.c["bytes_out_total"] += chunk.length

    def release(self, chunk: Chunk) -> None:
        chunk.leases -= 1
        if chunk.leases == 0 and chunk.pins == 0:
            self._idle(chunk)

    def unpin(self, chunk: Chunk) -> None:
        """Drop an internal hold (a tier took it with ``chunk.pins += 1``)."""
        chunk.pins -= 1
        if chunk.leases == 0 and chunk.pins == 0:
            self._idle(chunk)

    def _idle(self, chunk: Chunk) -> None:
        """The last lease or pin of ``chunk`` went."""
        if chunk.zombie:
            self.alloc.free(chunk.offset, chunk.length)
        elif chunk.parked == BUSY:
            self._unpark(chunk, self.clock())

    def hold(self, chunk: Chunk, seconds: float) -> None:
        self.index.hold(chunk, self.clock() + seconds)

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
        ikey = chunk.ikey
        cls = chunk.retention
        del self.index[ikey]
        unlink_chain(chunk)
        self._count[cls] -= 1
        was, chunk.parked = chunk.parked, GONE
        if was == IN_LRU:
            if chunk.queued:  # (a victim the scan just took has no entry left)
                self._stale_entry(cls)
        else:
            del self.parked[cls][ikey]
            if was == HELD:
                self._held_n -= 1  # its heap entry is now stale
        if chunk.retention == EPHEMERAL:
            self._by_expiry.pop(ikey, None)
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

    # -- reporting --------------------------------------------------------------------------
    def chunks_of(self, cls: int) -> Iterator[tuple[bytes, Chunk]]:
        """Every sealed chunk of retention ``cls`` in RAM, set aside or not (read-only use; a
        walk of the whole index, in seal order)."""
        for ikey, chunk in self.index.items():
            if chunk.retention == cls:
                yield ikey, chunk

    def chunks_by_class(self) -> dict[str, int]:
        return {RETENTIONS[c]: self._count[c] for c in EVICTION_ORDER}

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.c,
            "chunks": len(self.index),
            "chunks_parked": sum(len(p) for p in self.parked.values()),
            "reservations": len(self.pending),
            "arena_bytes_used": self.alloc.used,
            "arena_bytes_capacity": self.alloc.capacity,
            "arena_bytes_stored": self.bytes_stored,
            "arena_free_extents": self.alloc.extents,
            "arena_largest_free": self.alloc.largest_free,
            "chunks_by_class": self.chunks_by_class(),
            "evictions_by_class": dict(self.evictions_by_class),
        }


# the chunk and its constants, for the many importers of the store
__all__ = [
    "BUSY",
    "EPHEMERAL",
    "EVICTION_ORDER",
    "GONE",
    "HELD",
    "IN_LRU",
    "LONG",
    "NONE",
    "SHORT",
    "Chunk",
    "ReserveResult",
    "Store",
]
