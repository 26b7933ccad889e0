"""Pure-logic tests: sizes, the allocator, the store's policy (no daemon process needed)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.errors import UsageError
from infera.kvd import keyspace as ks
from infera.kvd.arena import ALIGN, Allocator
from infera.kvd.protocol import RETENTION_CODE, FrameReader, FrameTooLarge, encode
from infera.kvd.store import Store
from infera.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512M", 512 << 20),
        ("16G", 16 << 30),
        ("1T", 1 << 40),
        ("4096", 4096),
        ("1.5K", 1536),
        ("2GiB", 2 << 30),
    ],
)
def test_parse_size_binary_units(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "G", "12X", "-1G", "1e9", "ten"])
def test_parse_size_rejects_garbage_with_flag_name(text: str) -> None:
    with pytest.raises(UsageError, match="--max-bytes"):
        parse_size(text, "--max-bytes")


def test_parse_duration() -> None:
    assert parse_duration("5m") == 300 and parse_duration("250ms") == 0.25 and parse_duration("7") == 7


def test_same_size_chunks_never_fragment() -> None:
    size = 3 * ALIGN + 17  # not a multiple of the alignment on purpose
    slot = 4 * ALIGN
    alloc = Allocator(100 * slot)
    rng = random.Random(7)
    live: list[int] = []
    for _ in range(5000):
        if live and (len(live) == 100 or rng.random() < 0.5):
            alloc.free(live.pop(rng.randrange(len(live))), size)
        else:
            off = alloc.alloc(size)
            assert off is not None, "same-size allocation failed while the arena had room"
            live.append(off)
    for off in live:
        alloc.free(off, size)
    assert alloc.used == 0 and alloc.extents == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5 * ALIGN)), max_size=200))
def test_allocator_regions_never_overlap(ops: list[tuple[bool, int]]) -> None:
    alloc = Allocator(64 * ALIGN)
    live: dict[int, int] = {}
    for is_free, size in ops:
        if is_free and live:
            off = next(iter(live))
            alloc.free(off, live.pop(off))
            continue
        off = alloc.alloc(size)
        if off is None:
            continue
        assert off % ALIGN == 0 and off + size <= alloc.capacity
        for o, s in live.items():
            assert off + size <= o or o + s <= off, "overlapping regions"
        live[off] = size
    for off, size in list(live.items()):
        alloc.free(off, size)
    assert alloc.used == 0 and alloc.extents == 1 and alloc.largest_free == alloc.capacity


def _fill(store: Store, name: bytes, retention: str, size: int = ALIGN) -> bytes:
    ikey = ks.ikey(0, name)
    res = store.reserve(ikey, size, RETENTION_CODE[retention])
    assert res.chunk is not None, res.error
    store.seal(res.chunk)
    return ikey


def test_eviction_order_ephemeral_then_short_then_long() -> None:
    store = Store(6 * ALIGN)
    order = [
        (b"L1", "long"),
        (b"S1", "short"),
        (b"E1", "ephemeral"),
        (b"L2", "long"),
        (b"S2", "short"),
        (b"E2", "ephemeral"),
    ]
    for name, ret in order:
        _fill(store, name, ret)
    evicted = []
    for i in range(6):
        before = set(store.index)
        _fill(store, b"N%d" % i, "long")
        evicted += [ks.key_of(k) for k in before - set(store.index)]
    assert evicted == [b"E1", b"E2", b"S1", b"S2", b"L1", b"L2"]


def test_lru_within_a_class_respects_access() -> None:
    store = Store(3 * ALIGN)
    a = _fill(store, b"a", "long")
    _fill(store, b"b", "long")
    _fill(store, b"c", "long")
    chunk = store.find(a)
    assert chunk is not None
    store.touch(chunk)  # a is now the most recent
    _fill(store, b"d", "long")
    assert ks.ikey(0, b"b") not in store.index and a in store.index


def test_leased_chunk_is_never_evicted_and_full_is_reported() -> None:
    store = Store(2 * ALIGN)
    a = _fill(store, b"a", "short")
    b = _fill(store, b"b", "short")
    for ikey in (a, b):
        chunk = store.find(ikey)
        assert chunk is not None
        store.lease(chunk)
    res = store.reserve(ks.ikey(0, b"c"), ALIGN, RETENTION_CODE["long"])
    assert res.chunk is None and res.error == "full"
    assert a in store.index and b in store.index


def test_none_retention_is_never_stored() -> None:
    store = Store(4 * ALIGN)
    res = store.reserve(ks.ikey(0, b"x"), 10, RETENTION_CODE["none"])
    assert res.chunk is None and res.error == "none" and store.alloc.used == 0


def test_deleted_while_leased_is_freed_on_release() -> None:
    store = Store(2 * ALIGN)
    a = _fill(store, b"a", "long")
    chunk = store.find(a)
    assert chunk is not None
    store.lease(chunk)
    assert store.delete([a]) == 1
    assert store.alloc.used == ALIGN  # bytes still pinned by the reader
    store.release(chunk)
    assert store.alloc.used == 0


def test_ephemeral_expires_after_ttl() -> None:
    now = [100.0]
    store = Store(4 * ALIGN, ephemeral_ttl=10, clock=lambda: now[0])
    e = _fill(store, b"e", "ephemeral")
    assert store.find(e) is not None
    now[0] += 11
    assert store.find(e) is None and store.c["expired_total"] == 1 and store.alloc.used == 0


def test_frame_reader_splits_and_caps() -> None:
    r = FrameReader(max_frame=1024)
    data = encode({"op": "PING", "id": 1}) + encode({"op": "STATS", "id": 2})
    frames = r.feed(data[:3]) + r.feed(data[3:])
    assert len(frames) == 2
    with pytest.raises(FrameTooLarge):
        r.feed((5000).to_bytes(4, "big") + b"x")
