"""GET and LEASE follow a prompt's chain of chunks (``Chunk.succ``) instead of probing the index for
every key, and LOOKUP probes the index's table for all its keys at once: the answer must always be what the index alone would say, whatever writes, deletes,
overwrites, evictions and key orders came before, and the links must only ever join indexed
chunks (nothing evicted is kept alive by a link). A hostile client that thrashes the links does
not disturb a healthy one."""

from __future__ import annotations

import time
from typing import Any

from hostile import HealthProbe
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kvd import keyspace as ks
from infera.kvd.arena import ALIGN
from infera.kvd.chunk import link
from infera.kvd.client import KvdClient
from infera.kvd.protocol import RETENTION_CODE
from infera.kvd.store import Chunk, Store

SHORT = RETENTION_CODE["short"]
KEYS = [ks.ikey(1, bytes([i]) * 4) for i in range(12)]


def _put(store: Store, keys: list[bytes]) -> None:
    """One PUT of ``keys`` and its SEAL, linked in order as op_seal does."""
    prev: Chunk | None = None
    for k in keys:
        res = store.reserve(k, ALIGN, SHORT, overwrite=True)
        if res.chunk is None:
            prev = None
            continue
        if store.seal(res.chunk):
            if prev is not None:
                link(prev, res.chunk)
            prev = res.chunk


def _by_index(store: Store, keys: list[bytes]) -> int:
    n = 0
    for k in keys:
        if k not in store.index:
            break
        n += 1
    return n


def _read(store: Store, keys: list[bytes]) -> int:
    """How many of ``keys`` a GET or LEASE finds, counting from the first (they walk the chain;
    LOOKUP probes the index's table for all keys at once and never links)."""
    return sum(c is not None for c in store.find_many(keys, stop_at_miss=True))


def _check_links(store: Store) -> None:
    for chunk in store.index.values():
        for other, back in ((chunk.succ, "pred"), (chunk.pred, "succ")):
            if other is not None:
                assert store.index.get(other.ikey) is other, "a link leads out of the index"
                assert getattr(other, back) is chunk, "links go both ways"


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "lookup", "get", "delete"]),
        st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=8),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(3, 12))
def test_lookup_answers_what_the_index_says(steps: list[tuple[str, list[int]]], slots: int) -> None:
    store = Store(slots * ALIGN)  # room for fewer chunks than keys: PUTs evict
    for op, idx in steps:
        keys = [KEYS[i] for i in idx]
        if op == "put":
            _put(store, keys)
        elif op == "delete":
            store.delete(keys)
        elif op == "get":  # GET and LEASE: every key, found or not
            want_chunks = [store.index.get(k) for k in keys]
            assert store.find_many(keys) == want_chunks
        else:
            want = _by_index(store, keys)
            assert store.count_present(keys) == want
        _check_links(store)
    for chunk in list(store.index.values()):
        store.delete([chunk.ikey])
        assert chunk.succ is None and chunk.pred is None, "a chunk that left keeps no link"


def test_a_read_links_what_it_found_and_a_removal_unlinks() -> None:
    store = Store(8 * ALIGN)
    _put(store, KEYS[:2])
    _put(store, KEYS[2:4])  # a second batch: not linked to the first yet
    a, b, c = (store.index[k] for k in KEYS[1:4])
    assert a.succ is None and b.succ is c
    assert _read(store, KEYS[:4]) == 4
    assert a.succ is b and b.pred is a, "the read joined the two batches"
    store.delete([KEYS[2]])
    assert b.succ is None and c.pred is None
    assert _read(store, KEYS[:4]) == 2
    _put(store, [KEYS[2]])  # back, as a new chunk: found through the index, linked again
    assert _read(store, KEYS[:4]) == 4
    assert store.index[KEYS[1]].succ is store.index[KEYS[2]]


def test_a_read_never_moves_a_link() -> None:
    """A shared prefix keeps the branch it was sealed with; a GET of the other branch probes
    the index for its first chunk and writes nothing (reads in any order cost no link writes)."""
    store = Store(8 * ALIGN)
    head, x, y = KEYS[0], KEYS[1], KEYS[2]
    _put(store, [head, x])
    _put(store, [y])
    assert _read(store, [head, y]) == 2
    assert store.index[head].succ is store.index[x] and store.index[y].pred is None
    assert _read(store, [y, x]) == 2
    assert store.index[y].succ is None and store.index[x].pred is store.index[head]


def test_a_client_thrashing_the_links_leaves_others_served(daemon: Any) -> None:
    """Two branches after one prefix looked up in turn (a relink on every key), repeated keys,
    deletes and re-PUTs of the chain under the lookups: a healthy client's put+get stays correct
    and fast, and a second client's LOOKUPs stay exact."""
    prefix = [f"p{i}".encode() for i in range(64)]
    branch = [[f"b{j}-{i}".encode() for i in range(64)] for j in range(2)]
    with (
        HealthProbe(daemon.socket) as probe,
        KvdClient(daemon.socket, namespace="chain", name="thrasher") as bad,
        KvdClient(daemon.socket, namespace="chain", name="reader") as good,
    ):
        bad.put_many([(k, b"x" * 64) for k in prefix + branch[0] + branch[1]], retention="short")
        end = time.monotonic() + 3.0
        rounds = 0
        while time.monotonic() < end:
            j = rounds % 2
            assert bad.lookup(prefix + branch[j]) == 128
            assert bad.lookup([prefix[0]] * 50 + prefix[::-1]) == 114  # duplicates, reversed
            if rounds % 7 == 3:
                bad.delete(prefix[10:12])
                assert good.lookup(prefix + branch[j]) == 10
                bad.put_many([(k, b"y" * 64) for k in prefix[10:12]], retention="short")
            assert good.lookup(prefix + branch[1 - j]) == 128
            rounds += 1
        assert rounds > 20
        probe.assert_healthy()
