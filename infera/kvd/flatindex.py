"""The RAM tier's index: ikey -> :class:`~infera.kvd.chunk.Chunk` in one flat open-addressing
table, so that a LOOKUP of many keys probes them all in a few vectorized passes.

Why not a dict: with a million chunks indexed every probe of a dict misses the CPU caches three
or four times (its index, its entry, the stored key, the chunk), one key after another, because the
interpreter never overlaps them; a LOOKUP of 1,000 random keys then costs ~1 ms more than with 10k
chunks. Here a LOOKUP hashes its keys once, then gathers the table's rows for all of them at once
(numpy issues the loads back to back, so their misses overlap), and writes the access bit and the
hold of the hits into the same rows. It never touches a chunk object.

Layout: two parallel arrays of ``cap`` slots (a power of two), linear probing from the tag's
``(tag >> 1) & (cap - 1)`` (the tag is below):

* ``rows``: two int64 words per slot.
  * word 0, the **tag**: Python's hash of the ikey (SipHash with this process's random key, so
    no client can aim keys at one slot) with its lowest bit replaced by the chunk's *ephemeral*
    flag. ``EMPTY`` (0) and ``TOMB`` (1, a removed entry; probes go on past it) are never tags.
  * word 1, the **state**: ``hold_until_us << 1 | ref``: the LOOKUP hold's end (microseconds
    of the store's clock) and the CLOCK access bit (:mod:`infera.kvd.evictq`).
* ``objs``: the chunk of each slot (a numpy object array), which holds the full key.

A tag is 63 bits of a keyed hash, not the key: a scalar probe (:meth:`FlatIndex.get`, what GET,
PUT and DELETE use) always compares the chunk's ikey. The vectorized LOOKUP (:meth:`FlatIndex.
probe`) trusts the tag alone; a false hit has a chance of 2^-63 per probe, and costs a GET that
misses (counted, recomputed), never wrong bytes, since every read goes through :meth:`get`.

The table grows (doubling) when used plus removed slots pass 0.6 of it, and is rebuilt at the same
size when most of those are tombstones; a rebuild is vectorized (sort by home slot, place by a
running maximum), about 0.1 s at a million chunks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from infera.kvd.chunk import EPHEMERAL

if TYPE_CHECKING:
    from infera.kvd.chunk import Chunk

EMPTY, TOMB = 0, 1
MIN_CAP = 1024
MAX_FILL = 0.6  # used + removed slots, as a share of the table, before a rebuild
GROW_AT = 0.5  # a rebuild doubles the table while the live entries fill more than this
VECTOR_ROUNDS = 3  # vectorized probe rounds; keys still unresolved then go one by one
_U = 1_000_000  # the state word counts microseconds


def tag_of(h: int, ephemeral: bool) -> int:
    """The row tag of a chunk whose ikey hashes to ``h``."""
    t = (h & ~1) or 2  # (0 and 1 are EMPTY and TOMB)
    return t | ephemeral


def to_us(t: float) -> int:
    return round(t * _U)


class FlatIndex:
    """A mapping ikey -> Chunk (the dict operations the store and the tiers use) plus the
    per-chunk CLOCK bit and LOOKUP hold, and :meth:`probe` for many keys at once."""

    def __init__(self, cap: int = MIN_CAP) -> None:
        self.n = 0  # live entries
        self.tombs = 0
        self.rebuilds = 0
        self._alloc(cap)

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        self.mask = cap - 1
        self.rows = np.zeros((cap, 2), dtype=np.int64)
        self.tags = self.rows[:, 0]
        self.states = self.rows[:, 1]
        self.objs = np.empty(cap, dtype=object)
        self._w = memoryview(self.rows.data).cast("B").cast("q")  # scalar access: [2s], [2s + 1]
        self._limit = int(cap * MAX_FILL)

    # -- scalar probes (GET, PUT, DELETE, eviction) -----------------------------------------
    def _slot(self, ikey: bytes) -> int:
        """The slot holding ``ikey``, or -1."""
        h = hash(ikey)
        want = tag_of(h, False)
        w, objs, mask = self._w, self.objs, self.mask
        s = (want >> 1) & mask
        while True:
            t = w[2 * s]
            if t == EMPTY:
                return -1
            if (t & ~1) == want and objs[s].ikey == ikey:
                return s
            s = (s + 1) & mask

    def get(self, ikey: bytes) -> Chunk | None:
        s = self._slot(ikey)
        return None if s < 0 else self.objs[s]

    def __contains__(self, ikey: object) -> bool:
        return isinstance(ikey, bytes) and self._slot(ikey) >= 0

    def __getitem__(self, ikey: bytes) -> Chunk:
        s = self._slot(ikey)
        if s < 0:
            raise KeyError(ikey)
        return self.objs[s]  # type: ignore[no-any-return]

    def __setitem__(self, ikey: bytes, chunk: Chunk) -> None:
        h = hash(ikey)
        want = tag_of(h, False)
        w, objs, mask = self._w, self.objs, self.mask
        s = (want >> 1) & mask
        free = -1
        while True:
            t = w[2 * s]
            if t == EMPTY:
                break
            if t == TOMB:
                if free < 0:
                    free = s
            elif (t & ~1) == want and objs[s].ikey == ikey:
                free = s  # replaced: the new chunk starts with a clear state
                self.n -= 1
                self.tombs += 1
                break
            s = (s + 1) & mask
        if free < 0:
            free = s
        else:
            self.tombs -= 1
        w[2 * free] = tag_of(h, chunk.retention == EPHEMERAL)
        w[2 * free + 1] = 0
        objs[free] = chunk
        self.n += 1
        if self.n + self.tombs > self._limit:
            self._rebuild()

    def __delitem__(self, ikey: bytes) -> None:
        s = self._slot(ikey)
        if s < 0:
            raise KeyError(ikey)
        self._clear(s)

    def pop(self, ikey: bytes, default: Chunk | None = None) -> Chunk | None:
        s = self._slot(ikey)
        if s < 0:
            return default
        chunk: Chunk = self.objs[s]
        self._clear(s)
        return chunk

    def _clear(self, s: int) -> None:
        w, mask = self._w, self.mask
        self.objs[s] = None
        w[2 * s + 1] = 0
        self.n -= 1
        if w[2 * ((s + 1) & mask)] == EMPTY:
            # the end of a run: this slot and the tombstones just before it need not be walked
            w[2 * s] = EMPTY
            s = (s - 1) & mask
            while w[2 * s] == TOMB:
                w[2 * s] = EMPTY
                self.tombs -= 1
                s = (s - 1) & mask
        else:
            w[2 * s] = TOMB
            self.tombs += 1

    def __len__(self) -> int:
        return self.n

    def _live(self) -> np.ndarray:
        tags = self.tags
        return np.flatnonzero((tags != EMPTY) & (tags != TOMB)) if self.n else np.empty(0, dtype=np.int64)

    def values(self) -> list[Chunk]:
        """The chunks, in no particular order (a copy: the index may change meanwhile)."""
        return self.objs[self._live()].tolist()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[bytes]:
        return iter([c.ikey for c in self.values()])

    def items(self) -> list[tuple[bytes, Chunk]]:
        return [(c.ikey, c) for c in self.values()]

    # -- the state word ----------------------------------------------------------------------
    def _state_slot(self, chunk: Chunk) -> int:
        s = self._slot(chunk.ikey)
        return s if s >= 0 and self.objs[s] is chunk else -1

    def ref(self, chunk: Chunk) -> bool:
        s = self._state_slot(chunk)
        return s >= 0 and bool(self._w[2 * s + 1] & 1)

    def set_ref(self, chunk: Chunk, on: bool = True) -> None:
        s = self._state_slot(chunk)
        if s >= 0:
            w = self._w
            w[2 * s + 1] = (w[2 * s + 1] & ~1) | on

    def hold_until(self, chunk: Chunk) -> float:
        """When ``chunk``'s LOOKUP hold ends (0 when it has none, or is not indexed)."""
        s = self._state_slot(chunk)
        return 0.0 if s < 0 else (self._w[2 * s + 1] >> 1) / _U

    def hold(self, chunk: Chunk, until: float) -> None:
        s = self._state_slot(chunk)
        if s >= 0:
            w = self._w
            v = w[2 * s + 1]
            w[2 * s + 1] = max(v >> 1, to_us(until)) << 1 | (v & 1)

    def state(self, chunk: Chunk) -> tuple[bool, float]:
        """(ref, hold_until) of ``chunk`` in one probe (the victim scan)."""
        s = self._state_slot(chunk)
        if s < 0:
            return False, 0.0
        v = self._w[2 * s + 1]
        return bool(v & 1), (v >> 1) / _U

    # -- many keys at once (LOOKUP) ----------------------------------------------------------
    def probe(self, ikeys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """(slot of each key or -1, its tag) by tag alone (see the module docstring)."""
        n = len(ikeys)
        hs = np.fromiter(map(hash, ikeys), dtype=np.int64, count=n)
        want = hs & ~1
        want[want == 0] = 2
        slot = np.full(n, -1, dtype=np.int64)
        tag = np.zeros(n, dtype=np.int64)
        tags, mask = self.tags, self.mask
        todo = np.arange(n)
        s = (want >> 1) & mask
        for _ in range(VECTOR_ROUNDS):
            t = tags[s]
            hit = (t & ~1) == want
            if hit.any():
                slot[todo[hit]] = s[hit]
                tag[todo[hit]] = t[hit]
            go = ~hit & (t != EMPTY)
            if not go.any():
                return slot, tag
            todo, want, s = todo[go], want[go], (s[go] + 1) & mask
        w = self._w  # the few keys in long runs: one by one
        for i, wi, si in zip(todo.tolist(), want.tolist(), s.tolist(), strict=True):
            while True:
                t = w[2 * si]
                if (t & ~1) == wi:
                    slot[i], tag[i] = si, t
                    break
                if t == EMPTY:
                    break
                si = (si + 1) & mask
        return slot, tag

    def touch_many(self, slots: np.ndarray, hold_until: float) -> None:
        """Set the access bit of ``slots`` and extend their hold to ``hold_until`` (0: none)."""
        state = self.states
        if hold_until > 0:
            v = state[slots]
            state[slots] = np.maximum(v >> 1, to_us(hold_until)) << 1 | 1
        else:
            state[slots] |= 1

    # -- growth -------------------------------------------------------------------------------
    def _rebuild(self) -> None:
        live = self._live()
        m = len(live)
        cap = self.cap
        while m > cap * GROW_AT:
            cap *= 2
        rows, objs = self.rows.view(np.complex128).ravel()[live], self.objs[live]  # a row: 16 bytes
        self._alloc(cap)
        self.tombs = 0
        self.rebuilds += 1
        if not m:
            return
        home = (rows.view(np.int64)[0::2] >> 1) & self.mask
        order = np.argsort(home)
        home = home[order]
        # linear probing in home order: each entry lands at max(its home, the previous one's + 1)
        pos = np.arange(m) + np.maximum.accumulate(home - np.arange(m))
        inside = pos < cap
        self.rows.view(np.complex128).ravel()[pos[inside]] = rows[order[inside]]
        self.objs[pos[inside]] = objs[order[inside]]
        w, mask = self._w, self.mask
        for i in order[~inside].tolist():  # past the end: wrap round to the first free slot
            tag = int(rows[i : i + 1].view(np.int64)[0])
            s = (tag >> 1) & mask
            while w[2 * s] != EMPTY:
                s = (s + 1) & mask
            self.rows.view(np.complex128).ravel()[s] = rows[i]
            self.objs[s] = objs[i]


__all__ = ["EMPTY", "TOMB", "FlatIndex", "tag_of", "to_us"]
