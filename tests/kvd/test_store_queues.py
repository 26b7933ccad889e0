"""The RAM tier's index queues (Store units): the structure that makes refusing a write to a
full arena cheap, and a random model of what clients do to it. Moved out of
test_hostile_store.py, whose daemon tests run hostile clients against the same code."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kvd import keyspace as ks
from infera.kvd import protocol as P
from infera.kvd.arena import ALIGN, align_up
from infera.kvd.protocol import RETENTION_CODE
from infera.kvd.store import BUSY, GONE, HELD, IN_LRU, Chunk, Store

EPHEMERAL, SHORT, LONG = (RETENTION_CODE[r] for r in ("ephemeral", "short", "long"))
STORE_REFUSAL_S = 1.5


def _sealed(store: Store, name: bytes, retention: int = SHORT, size: int = ALIGN) -> Chunk:
    res = store.reserve(ks.ikey(0, name), size, retention)
    assert res.chunk is not None, res.error
    store.seal(res.chunk)
    return res.chunk


def _check_queues(store: Store) -> None:
    """Every indexed chunk not set aside has exactly one live entry (its last) in its class's
    deque; every other entry is counted stale; the class counts add up."""
    for cls, q in store.lru.items():
        live = [c for c in q if c.parked == IN_LRU]
        seen: dict[int, int] = {}
        for c in live:
            seen[id(c)] = seen.get(id(c), 0) + 1
        assert all(c.queued == seen[id(c)] for c in live)
        assert len(seen) == sum(1 for c in store.index.values() if c.retention == cls and c.parked == IN_LRU)
        assert len(q) - len(seen) == store.stale[cls] >= 0
        assert all(c.parked == GONE or c.ikey in store.index for c in q)
    assert sum(store.chunks_by_class().values()) == len(store.index)
    assert sum(len(p) for p in store.parked.values()) == sum(1 for c in store.index.values() if c.parked)


def _fill_all(store: Store, retention: int = SHORT) -> list[Chunk]:
    out = []
    while store.alloc.free_bytes >= ALIGN:
        out.append(_sealed(store, b"f%d" % len(out), retention))
    return out


@pytest.mark.parametrize("how", ["lease", "hold", "pin"])
def test_store_refusal_sets_each_chunk_in_use_aside_once(how: str) -> None:
    store = Store(16 << 20)
    chunks = _fill_all(store)
    for chunk in chunks:
        if how == "lease":
            store.lease(chunk)
        elif how == "hold":
            store.hold(chunk, 600)
        else:
            chunk.pins += 1  # the way the tiers pin
    keys = [ks.ikey(1, b"k%d" % i) for i in range(P.MAX_BATCH)]
    t0 = time.monotonic()
    results = store.reserve_many(keys, [ALIGN] * len(keys), LONG)
    assert time.monotonic() - t0 <= STORE_REFUSAL_S
    assert [r.error for r in results] == ["full"] * len(keys)
    assert store.c["evict_skipped_total"] == len(chunks)
    assert sum(len(p) for p in store.parked.values()) == len(chunks)
    # one at a time, outside a batch: still no rescan
    for key in keys[:1000]:
        assert store.reserve(key, ALIGN, LONG).error == "full"
    assert store.c["evict_skipped_total"] == len(chunks)
    assert store.chunks_by_class()["short"] == len(chunks) == len(list(store.chunks_of(SHORT)))


def test_store_released_chunks_come_back_at_the_mru_end() -> None:
    store = Store(4 * ALIGN)
    a, b, c, d = (_sealed(store, n) for n in (b"a", b"b", b"c", b"d"))
    for chunk in (a, b, c, d):
        store.lease(chunk)
    assert store.reserve(ks.ikey(0, b"x"), ALIGN, SHORT).error == "full"
    assert all(ch.parked == BUSY for ch in (a, b, c, d))
    store.release(c)
    store.release(a)  # released after c: more recent
    evicted = []
    for name in (b"x", b"y"):
        before = set(store.index)
        res = store.reserve(ks.ikey(0, name), ALIGN, SHORT)
        assert res.chunk is not None
        evicted += [ks.key_of(k) for k in before - set(store.index)]
    assert evicted == [b"c", b"a"]
    assert store.reserve(ks.ikey(0, b"z"), ALIGN, SHORT).error == "full"


def test_store_held_chunks_come_back_when_the_hold_passes() -> None:
    now = [100.0]
    store = Store(2 * ALIGN, clock=lambda: now[0])
    a, b = _sealed(store, b"a"), _sealed(store, b"b")
    assert store.count_present([a.ikey, b.ikey], hold_s=10) == 2
    assert store.reserve(ks.ikey(0, b"x"), ALIGN, SHORT).error == "full"
    assert a.parked == HELD and b.parked == HELD
    now[0] += 5
    assert store.count_present([b.ikey], hold_s=10) == 1  # b's hold renewed while parked
    now[0] += 6  # a's hold has passed, b's has not
    res = store.reserve(ks.ikey(0, b"x"), ALIGN, SHORT)
    assert res.chunk is not None and a.ikey not in store.index and b.ikey in store.index
    store.seal(res.chunk)
    assert store.reserve(ks.ikey(0, b"y"), ALIGN, SHORT).chunk is not None  # x was evictable
    assert b.ikey in store.index
    now[0] += 10
    store.lease(b)  # the hold passes while b is leased: back only when the lease goes
    store.sweep()
    assert b.parked == BUSY
    store.release(b)
    assert b.parked == 0 and b in store.lru[SHORT]


def test_store_pinned_chunk_comes_back_on_unpin() -> None:
    store = Store(2 * ALIGN)
    a, b = _sealed(store, b"a", LONG), _sealed(store, b"b", LONG)
    a.pins += 1
    b.pins += 1
    assert store.reserve(ks.ikey(0, b"x"), ALIGN, LONG).error == "full"
    store.unpin(b)
    assert store.reserve(ks.ikey(0, b"x"), ALIGN, LONG).chunk is not None
    assert b.ikey not in store.index and a.ikey in store.index


def _two_ephemeral(ttl: float) -> tuple[list[float], Store, Any, Any]:
    """A store on a hand-moved clock (``now[0]``) holding two ephemeral chunks, e then f."""
    now = [0.0]
    store = Store(4 * ALIGN, ephemeral_ttl=ttl, clock=lambda: now[0])
    return now, store, _sealed(store, b"e", EPHEMERAL), _sealed(store, b"f", EPHEMERAL)


def test_store_ephemeral_expired_while_leased_goes_when_released() -> None:
    now, store, e, f = _two_ephemeral(10)
    store.lease(e)
    now[0] += 11
    assert store.sweep() == 1  # f; e is in use
    assert f.ikey not in store.index and e.ikey in store.index and e.parked == BUSY
    store.release(e)
    assert e.ikey not in store.index and store.c["expired_total"] == 2 and store.alloc.used == 0


def test_store_sweep_expires_from_the_front_of_the_seal_order() -> None:
    now = [0.0]
    store = Store(1 << 20, ephemeral_ttl=10, clock=lambda: now[0])
    chunks = []
    for i in range(200):
        chunks.append(_sealed(store, b"e%d" % i, EPHEMERAL))
        now[0] += 1
    store.touch(chunks[0])  # access does not extend an ephemeral chunk's life
    now[0] = 10.0
    assert store.sweep() == 1
    now[0] = 59.0
    assert store.sweep() == 49 and len(store._by_expiry) == 150
    assert chunks[50].ikey in store.index and chunks[49].ikey not in store.index


def test_store_reserve_many_rolls_back_when_something_raises() -> None:
    store = Store(4 * ALIGN)
    _sealed(store, b"old")
    used = store.alloc.used

    def boom(chunk: Chunk, reason: str) -> None:
        raise RuntimeError("a tier hook failed")

    store.on_drop = boom
    keys = [ks.ikey(0, b"n%d" % i) for i in range(4)]  # the 4th needs an eviction: boom
    with pytest.raises(RuntimeError):
        store.reserve_many(keys, [ALIGN] * 4, SHORT)
    assert not store.pending and store.alloc.used == used
    assert store.c["put_rolled_back_total"] == 3
    store.on_drop = None
    assert all(r.chunk is not None for r in store.reserve_many(keys[:3], [ALIGN] * 3, SHORT))


def test_store_reserve_many_fails_fast_only_for_sizes_that_cannot_fit() -> None:
    store = Store(3 * ALIGN)
    a = _sealed(store, b"a")
    store.lease(a)
    lengths = [3 * ALIGN, ALIGN, 2 * ALIGN, ALIGN, ALIGN, 5 * ALIGN]
    keys = [ks.ikey(0, b"k%d" % i) for i in range(len(lengths))]
    got = [r.error or "ok" for r in store.reserve_many(keys, lengths, SHORT)]
    assert got == ["full", "ok", "full", "ok", "full", "too_large"]
    assert store.reserve(ks.ikey(0, b"later"), ALIGN, SHORT).error == "full"
    assert store.c["put_rejected_full_total"] == 4
    # nothing refused yet: even the largest chunk that fits is tried
    empty = Store(3 * ALIGN)
    (res,) = empty.reserve_many([ks.ikey(0, b"all")], [3 * ALIGN - 1], SHORT)
    assert res.chunk is not None


# A random model: whatever clients do, every indexed chunk sits in exactly one queue of its
# class, the arena's bytes add up, and "full" means nothing evictable was left.
_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"), st.integers(0, 11), st.integers(1, 3), st.sampled_from([EPHEMERAL, SHORT, LONG])
        ),
        st.tuples(st.just("lease"), st.integers(0, 11)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("pin"), st.integers(0, 11)),
        st.tuples(st.just("unpin"), st.integers(0, 50)),
        st.tuples(st.just("lookup"), st.integers(0, 11), st.integers(0, 30)),
        st.tuples(st.just("delete"), st.integers(0, 11)),
        st.tuples(st.just("tick"), st.integers(1, 20)),
        st.tuples(st.just("batch"), st.integers(0, 11), st.integers(1, 12)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_store_model(ops: list[tuple]) -> None:
    now = [0.0]
    store = Store(8 * ALIGN, ephemeral_ttl=15, clock=lambda: now[0])
    leased: list[Chunk] = []
    pinned: list[Chunk] = []
    key = lambda i: ks.ikey(0, b"k%d" % i)  # noqa: E731

    def check(full: bool) -> None:
        t = now[0]
        for ikey, chunk in store.index.items():
            if chunk.parked == IN_LRU:
                assert chunk.queued >= 1 and ikey not in store.parked[chunk.retention]
            else:
                assert store.parked[chunk.retention].get(ikey) is chunk
            if chunk.parked == BUSY:
                assert chunk.leases or chunk.pins
            if full:
                assert not store.evictable(chunk, t), "refused full with an evictable chunk in RAM"
        _check_queues(store)
        live = {id(c): c for c in [*store.index.values(), *store.pending.values(), *leased, *pinned]}
        assert store.alloc.used == sum(align_up(max(c.length, 1)) for c in live.values())

    for op in ops:
        if op[0] in ("put", "batch"):
            if op[0] == "put":
                results = [store.reserve(key(op[1]), op[2] * ALIGN, op[3], overwrite=True)]
            else:
                keys = [key((op[1] + j) % 12) for j in range(op[2])]
                results = store.reserve_many(keys, [ALIGN] * len(keys), SHORT, overwrite=True)
            check(full=any(r.error == "full" for r in results))
            for r in results:
                if r.chunk is not None:
                    store.seal(r.chunk)
        elif op[0] in ("lease", "pin"):
            chunk = store.find(key(op[1]))
            if chunk is not None:
                if op[0] == "lease":
                    store.lease(chunk)
                    leased.append(chunk)
                else:
                    chunk.pins += 1
                    pinned.append(chunk)
        elif op[0] == "release" and leased:
            store.release(leased.pop(op[1] % len(leased)))
        elif op[0] == "unpin" and pinned:
            store.unpin(pinned.pop(op[1] % len(pinned)))
        elif op[0] == "lookup":
            store.count_present([key(op[1])], hold_s=float(op[2]))
        elif op[0] == "delete":
            store.delete([key(op[1])])
        elif op[0] == "tick":
            now[0] += op[1]
            store.sweep()
        check(full=False)
    for chunk in leased:
        store.release(chunk)
    for chunk in pinned:
        store.unpin(chunk)
    store.delete(list(store.index))
    assert store.alloc.used == 0 and not any(store.parked.values())


# -- the CLOCK queues (issue 23) --------------------------------------------------------------------


def test_store_lookup_gives_a_second_chance_not_a_new_place() -> None:
    store = Store(4 * ALIGN)
    a, b, c, d = (_sealed(store, n) for n in (b"a", b"b", b"c", b"d"))
    assert store.count_present([c.ikey, a.ikey]) == 2
    ref = store.index.ref
    assert ref(a) and ref(c) and not ref(b) and list(store.lru[SHORT]) == [a, b, c, d]  # nothing moved
    evicted = []
    for name in (b"w", b"x", b"y", b"z"):
        before = set(store.index)
        store.seal(store.reserve(ks.ikey(0, name), ALIGN, SHORT).chunk)  # type: ignore[arg-type]
        evicted += [ks.key_of(k) for k in before - set(store.index)]
    # the untouched go first; a and c went back to the young end when the scan met them (a
    # before w was sealed, c after), each once
    assert evicted == [b"b", b"d", b"a", b"w"]
    assert c.ikey in store.index
    _check_queues(store)


def test_store_stale_entries_are_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    import infera.kvd.evictq as evictq

    monkeypatch.setattr(evictq, "COMPACT_MIN", 8)
    store = Store(64 * ALIGN)
    keep = [_sealed(store, b"keep%d" % i) for i in range(4)]
    for i in range(500):  # overwrites and deletes, never an eviction: every old entry goes stale
        name = b"churn%d" % (i % 16)
        res = store.reserve(ks.ikey(0, name), ALIGN, SHORT, overwrite=True)
        assert res.chunk is not None
        store.seal(res.chunk)
        if i % 3 == 0:
            store.delete([ks.ikey(0, name)])
        _check_queues(store)
    assert len(store.lru[SHORT]) <= 2 * (len(store.index) + 8) + 1
    # order survives compaction: the kept chunks are still the oldest
    assert list(store.lru[SHORT])[:4] == keep


def test_store_parked_from_the_middle_then_back_is_queued_once() -> None:
    now, store, e, f = _two_ephemeral(5)
    store.lease(f)
    now[0] += 6
    store.sweep()  # e expires; f is leased: set aside from the middle of the queue
    assert e.ikey not in store.index and f.parked == BUSY and f.queued == 1
    _check_queues(store)
    store.lease(f)
    store.release(f)
    store.release(f)  # back, and expired at once (its TTL passed while it was leased)
    assert f.ikey not in store.index and store.alloc.used == 0
    _check_queues(store)
    assert store.stale[EPHEMERAL] == 3 and f.queued == 2  # e's entry, f's old and its new one
    g = _sealed(store, b"g", EPHEMERAL)
    assert store.reserve(ks.ikey(0, b"x"), 4 * ALIGN, SHORT).chunk is not None  # g evicted
    assert g.ikey not in store.index and store.stale[EPHEMERAL] == 0 and not store.lru[EPHEMERAL]
    _check_queues(store)
