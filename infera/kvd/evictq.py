"""The eviction queues of the RAM tier, and the chunks set aside from them.

The eviction queue of a class (``lru[cls]``) is a deque of chunks, oldest first, kept by the CLOCK
rule (second chance): an access (LOOKUP, GET, a PUT of a present key) only sets the chunk's
access bit (kept in the index's table, :mod:`infera.kvd.flatindex`), and the victim scan sends a
chunk whose bit is set back to the young end once, clearing the bit, instead of evicting it. A
LOOKUP of 1,000 keys thus writes one word per key instead of relinking an ordered dict (half of its cost with a million chunks indexed, and 90 bytes
per chunk). The order is exact LRU except among chunks accessed since they were queued, which go
back in queue order rather than access order; each access buys at most one re-queue, so eviction
stays O(1) per key, amortized. Entries of chunks that left the queue (deleted, overwritten,
expired, set aside) stay in the deque as stale entries (``Chunk.parked`` says so; ``Chunk.queued``
counts a chunk's entries, its last one is the live one) until the scan meets them or, once they
outnumber the live ones, the deque is compacted.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable

from infera.kvd.arena import Allocator
from infera.kvd.chunk import BUSY, COMPACT_MIN, EPHEMERAL, EVICTION_ORDER, HELD, IN_LRU, Chunk
from infera.kvd.flatindex import FlatIndex
from infera.kvd.protocol import RETENTIONS


class EvictionQueues:
    """Eviction for :class:`infera.kvd.store.Store`: expiry, the queues, the chunks set aside, the
    victim scan (the store owns the state named here)."""

    index: FlatIndex  # also keeps each chunk's access bit and hold
    lru: dict[int, deque[Chunk]]
    stale: dict[int, int]
    parked: dict[int, dict[bytes, Chunk]]
    c: dict[str, int]
    _held: list[tuple[float, int, Chunk]]
    _held_n: int
    _seq: itertools.count[int]
    alloc: Allocator
    clock: Callable[[], float]
    evictions_by_class: dict[str, int]
    _by_expiry: OrderedDict[bytes, Chunk]
    # provided by Store (annotations only)
    _expire: Callable[[Chunk], None]
    _unlink: Callable[[Chunk, str], None]

    def sweep(self) -> int:
        """Expire ephemeral chunks whose TTL has passed; returns how many went. Also brings back
        the chunks whose LOOKUP hold ended. Costs O(what expired), not O(chunks)."""
        now = self.clock()
        self._end_holds(now)
        queue = self._by_expiry
        n = 0
        while queue:
            chunk = next(iter(queue.values()))
            if chunk.expires > now:
                break
            del queue[chunk.ikey]
            if self.evictable(chunk, now):
                self._expire(chunk)
                n += 1
            elif chunk.parked == IN_LRU:
                # in use: set aside; it expires when it comes back (see _unpark)
                self._park(chunk, BUSY if chunk.leases or chunk.pins else HELD)
        return n

    def evictable(self, chunk: Chunk, now: float) -> bool:
        return not chunk.leases and not chunk.pins and self.index.hold_until(chunk) <= now

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

    def _enqueue(self, chunk: Chunk, new: bool = False) -> None:
        """Append an indexed chunk to its class's eviction candidates (the young end), its
        access bit cleared (a ``new`` entry of the index starts clear)."""
        self.lru[chunk.retention].append(chunk)
        chunk.queued += 1
        if not new:
            self.index.set_ref(chunk, False)

    def _stale_entry(self, cls: int) -> None:
        """One more entry of the deque of ``cls`` no longer stands for its chunk (whose state
        says so already); compact the deque once stale entries outnumber live ones (amortized
        O(1) per entry)."""
        self.stale[cls] += 1
        q = self.lru[cls]
        if self.stale[cls] > COMPACT_MIN and 2 * self.stale[cls] > len(q):
            keep = []
            for chunk in q:
                chunk.queued -= 1
                if not chunk.queued and chunk.parked == IN_LRU:
                    keep.append(chunk)  # the last entry of a queued chunk
            for chunk in keep:
                chunk.queued = 1
            q.clear()  # in place: a scan may hold the deque
            q.extend(keep)
            self.stale[cls] = 0

    def _park(self, chunk: Chunk, state: int) -> None:
        """Take ``chunk`` out of the eviction candidates: leased/pinned (BUSY) or held (HELD)."""
        self.parked[chunk.retention][chunk.ikey] = chunk
        chunk.parked = state
        if chunk.queued:  # set aside from the middle of the queue (sweep): its entry goes stale
            self._stale_entry(chunk.retention)
        self.c["evict_skipped_total"] += 1
        if state == HELD:
            self._push_held(chunk)

    def _push_held(self, chunk: Chunk, until: float | None = None) -> None:
        """Into the heap of held chunks, by when its hold ends (``until`` when the caller has
        just read it from the index)."""
        if until is None:
            until = self.index.hold_until(chunk)
        heap = self._held
        heapq.heappush(heap, (until, next(self._seq), chunk))
        self._held_n += 1
        if len(heap) > 2 * self._held_n + 1024:  # mostly stale entries (chunks gone): compact
            self._held = [e for e in heap if e[2].parked == HELD]
            heapq.heapify(self._held)

    def _unpark(self, chunk: Chunk, now: float) -> None:
        """A parked chunk without leases or pins: held still, back to the candidates (at the MRU
        end), or, an ephemeral chunk whose TTL passed meanwhile, expired."""
        until = self.index.hold_until(chunk)
        if until > now:
            if chunk.parked != HELD:
                chunk.parked = HELD
                self._push_held(chunk, until)
            return
        del self.parked[chunk.retention][chunk.ikey]
        chunk.parked = IN_LRU
        self._enqueue(chunk)
        if chunk.retention == EPHEMERAL and chunk.expires <= now:
            self._expire(chunk)

    def _end_holds(self, now: float) -> None:
        """Move chunks whose hold has passed out of the heap (O(log n) each)."""
        heap = self._held
        while heap and heap[0][0] <= now:
            chunk = heapq.heappop(heap)[2]
            if chunk.parked != HELD:
                continue  # stale: the chunk went meanwhile
            self._held_n -= 1
            until = self.index.hold_until(chunk)
            if until > now:  # the hold was renewed while parked
                self._push_held(chunk, until)
            elif chunk.leases or chunk.pins:
                chunk.parked = BUSY  # back when the last lease or pin goes
            else:
                self._unpark(chunk, now)

    def _next_victim(self, cls: int, now: float) -> Chunk | None:
        """The oldest evictable chunk of ``cls`` not accessed since it was queued, taken off the
        queue; an accessed one goes back to the young end once, what is in use is set aside."""
        q = self.lru[cls]
        while q:
            chunk = q.popleft()
            chunk.queued -= 1
            if chunk.queued or chunk.parked != IN_LRU:
                self.stale[cls] -= 1  # an older entry of a re-queued chunk, or a chunk gone
            elif chunk.leases or chunk.pins:
                self._park(chunk, BUSY)
            else:
                ref, hold_until = self.index.state(chunk)
                if hold_until > now:
                    self._park(chunk, HELD)
                elif ref:
                    self._enqueue(chunk)  # second chance (clears the bit)
                else:
                    return chunk
        return None
