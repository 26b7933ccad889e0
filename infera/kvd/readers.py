"""The RAM tier's reads of its index (a mixin of :class:`infera.kvd.store.Store`): one key, and a
request's keys along a prompt's chain of chunks (:func:`infera.kvd.chunk.link`), for GET and
LEASE; and LOOKUP's count, one vectorized probe of the index's table."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from infera.kvd.chunk import EPHEMERAL, Chunk, link
from infera.kvd.flatindex import FlatIndex


class Readers:
    """Reads for :class:`infera.kvd.store.Store` (the store owns the state named here)."""

    index: FlatIndex
    clock: Callable[[], float]

    def _expire(self, chunk: Chunk) -> None:  # provided by the store
        raise NotImplementedError

    def find(self, ikey: bytes) -> Chunk | None:
        chunk = self.index.get(ikey)
        if chunk is not None and chunk.retention == EPHEMERAL and chunk.expires <= self.clock():
            self._expire(chunk)
            return None
        return chunk

    def find_many(self, ikeys: list[bytes], stop_at_miss: bool = False) -> list[Chunk | None]:
        """The chunks of ``ikeys`` (None where absent or expired), in order, for GET and LEASE:
        a prompt's keys come in the order they were sealed, so each chunk's successor
        (:func:`~infera.kvd.chunk.link`) is compared with the next key before the index is probed;
        two misses of that in a row and the rest are probed directly. ``stop_at_miss``: the list
        ends at the first None. An expired ephemeral chunk is dropped (as :meth:`find`)."""
        get = self.index.get
        now = self.clock()
        out: list[Chunk | None] = []
        prev: Chunk | None = None
        strikes = 0  # the chain failed twice in a row: keys not in stored order, the index only
        for ikey in ikeys:
            chunk = prev.succ if prev is not None and strikes < 2 else None  # the next chunk?
            if chunk is not None and chunk.ikey == ikey:
                strikes = 0
            else:
                strikes += prev is not None
                chunk = get(ikey)
                if chunk is not None and prev is not None and prev.succ is None and chunk.pred is None:
                    link(prev, chunk)  # a gap between two SEAL batches: never moves a link
            if chunk is not None and chunk.retention == EPHEMERAL and chunk.expires <= now:
                self._expire(chunk)
                chunk = None
            out.append(chunk)
            if chunk is None and stop_at_miss:
                break
            prev = chunk
        return out

    def count_present(self, ikeys: list[bytes], hold_s: float = 0.0) -> int:
        """LOOKUP's hot path: how many of ``ikeys`` are in RAM counting from the first (so a long
        tier can continue the count at that index). Found chunks are touched (and held for
        ``hold_s``)."""
        count, slots = self.present(ikeys)
        if count and hold_s:
            self.index.touch_many(slots, self.clock() + hold_s)
        return count

    def present(self, ikeys: list[bytes]) -> tuple[int, np.ndarray]:
        """How many of ``ikeys`` are in RAM counting from the first, and their slots in the index's
        table (:meth:`FlatIndex.touch_many` holds them); the found chunks are touched. One
        vectorized probe of the table for all keys (:meth:`FlatIndex.probe`); chunk objects are
        read only for ephemeral hits (has the TTL passed? then absent, but not dropped here)."""
        if not ikeys:
            return 0, np.empty(0, dtype=np.int64)
        index = self.index
        slot, tag = index.probe(ikeys)
        miss = np.flatnonzero(slot < 0)
        count = int(miss[0]) if miss.size else len(ikeys)
        now = self.clock()
        eph = np.flatnonzero(tag[:count] & 1)
        if eph.size:
            objs = index.objs
            for i, s in zip(eph.tolist(), slot[eph].tolist(), strict=True):
                if objs[s].expires <= now:
                    count = i
                    break
        if count:
            index.touch_many(slot[:count], 0.0)
        return count, slot[:count]
