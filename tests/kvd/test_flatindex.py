"""The RAM index's flat table (:mod:`infera.kvd.flatindex`) against a dict: every mapping operation,
the vectorized LOOKUP probe and the per-chunk state (access bit, hold) must agree with the model
through inserts, overwrites, deletes, tombstone clean-up, rebuilds and wrap-around. A tiny table
makes long probe runs and wrap-around the common case."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from hostile import HealthProbe, client_process
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kvd.chunk import EPHEMERAL, Chunk
from infera.kvd.client import KvdClient
from infera.kvd.flatindex import EMPTY, TOMB, FlatIndex
from infera.kvd.protocol import RETENTION_CODE

SHORT = RETENTION_CODE["short"]
KEYS = [b"\x00\x01" + bytes([i]) * (1 + i % 5) for i in range(40)]

ops = st.lists(
    st.tuples(
        st.sampled_from(["set", "set", "del", "pop", "ref", "unref", "hold", "probe"]),
        st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=12),
        st.integers(0, 100),
    ),
    min_size=1,
    max_size=60,
)


def _check(idx: FlatIndex, model: dict[bytes, Chunk]) -> None:
    assert len(idx) == len(model)
    assert sorted(idx) == sorted(model)
    assert {id(c) for c in idx.values()} == {id(c) for c in model.values()}
    for k in KEYS:
        assert idx.get(k) is model.get(k)
        assert (k in idx) == (k in model)
    tags = idx.tags
    assert int(((tags != EMPTY) & (tags != TOMB)).sum()) == idx.n
    assert int((tags == TOMB).sum()) == idx.tombs
    assert idx.n + idx.tombs <= idx.cap * 0.6 + 1


@settings(max_examples=400, deadline=None)
@given(ops, st.sampled_from([2, 4, 8, 1024]))
def test_the_table_answers_as_a_dict(steps: list[tuple[str, list[int], int]], cap: int) -> None:
    idx = FlatIndex(cap)
    model: dict[bytes, Chunk] = {}
    refs: dict[bytes, bool] = {}
    holds: dict[bytes, float] = {}
    for op, which, arg in steps:
        keys = [KEYS[i] for i in which]
        if op == "set":
            for k in keys:
                c = Chunk(k, 0, 1, EPHEMERAL if arg % 3 == 0 else SHORT)
                idx[k] = c
                model[k] = c
                refs[k], holds[k] = False, 0.0  # a new chunk starts clear
        elif op in ("del", "pop"):
            for k in keys:
                if op == "pop":
                    assert idx.pop(k) is model.pop(k, None)
                elif k in model:
                    del idx[k]
                    del model[k]
        elif op in ("ref", "unref", "hold"):
            for k in keys:
                c = model.get(k) or Chunk(k, 0, 1, SHORT)  # an unindexed chunk: a no-op
                if op == "hold":
                    idx.hold(c, arg / 10)
                    if k in model:
                        holds[k] = max(holds[k], arg / 10)
                else:
                    idx.set_ref(c, op == "ref")
                    if k in model:
                        refs[k] = op == "ref"
        else:  # LOOKUP: the vectorized probe finds exactly the indexed keys, tags and all
            slot, tag = idx.probe(keys)
            for k, s, t in zip(keys, slot.tolist(), tag.tolist(), strict=True):
                if k in model:
                    assert s >= 0 and idx.objs[s] is model[k]
                    assert bool(t & 1) == (model[k].retention == EPHEMERAL)
                else:
                    assert s == -1
            found = slot[slot >= 0]
            idx.touch_many(found, arg / 10)
            for k in keys:
                if k in model:
                    refs[k] = True
                    if arg:
                        holds[k] = max(holds[k], arg / 10)
        for k, c in model.items():
            assert idx.state(c) == (refs[k], holds[k]), k
            assert idx.ref(c) == refs[k] and idx.hold_until(c) == holds[k]
        _check(idx, model)


def test_a_rebuild_keeps_every_entry_and_its_state() -> None:
    idx = FlatIndex(16)
    chunks = [Chunk(b"\x00\x02k%d" % i, 0, 1, SHORT) for i in range(5000)]
    for i, c in enumerate(chunks):
        idx[c.ikey] = c
        if i % 3 == 0:
            idx.set_ref(c)
        if i % 5 == 0:
            idx.hold(c, 1.5)
    assert idx.rebuilds >= 3 and idx.cap >= 8192
    for c in chunks[::2]:
        del idx[c.ikey]
    for _ in range(3000):  # churn: tombstones pile up and force same-size rebuilds
        c = Chunk(b"\x00\x03%d" % _, 0, 1, SHORT)
        idx[c.ikey] = c
        del idx[c.ikey]
    for i, c in enumerate(chunks):
        if i % 2 == 0:
            assert c.ikey not in idx
        else:
            assert idx.get(c.ikey) is c and idx.state(c) == (i % 3 == 0, 1.5 if i % 5 == 0 else 0.0)
    slot, _tag = idx.probe([c.ikey for c in chunks])
    assert ((slot >= 0) == (np.arange(len(chunks)) % 2 == 1)).all()


def test_a_key_whose_tag_matches_is_still_compared() -> None:
    """Two keys with one tag (forced here by planting a row): a scalar probe compares the chunk's
    key, so GET, PUT and DELETE never take one for the other."""
    idx = FlatIndex(8)
    a = Chunk(b"\x00\x01a", 0, 1, SHORT)
    idx[a.ikey] = a
    s = int(idx.probe([a.ikey])[0][0])
    other = b"\x00\x01b"
    assert idx.get(other) is None and other not in idx
    b = Chunk(other, 0, 1, SHORT)
    idx[other] = b
    idx.tags[int(idx.probe([other])[0][0])] = idx.tags[s]  # b's row now carries a's tag
    assert idx.get(a.ikey) is a and idx.get(other) is None  # never b for a
    assert idx.pop(a.ikey) is a


_CHURN = """
    import os, sys, time
    from infera.kvd.client import KvdClient
    mine = [bytes.fromhex(h) for h in sys.argv[2].split(",")]
    end = time.monotonic() + float(sys.argv[3])
    rounds = 0
    with KvdClient(sys.argv[1], namespace="churn", name="churner") as bad:
        while time.monotonic() < end:
            junk = [os.urandom(1 + (i + rounds) % 64) for i in range(3000)]
            bad.put_many([(k, b"") for k in junk], retention="ephemeral")
            assert bad.lookup([*junk[:500], os.urandom(32)]) == 500
            bad.delete(junk)
            look_alike = [k[:-1] + bytes([k[-1] ^ 1]) for k in mine[:50]]  # one bit off each
            assert bad.lookup(look_alike) == 0 and bad.lookup([mine[0]] * 100) == 100
            rounds += 1
    print(rounds)
"""


def test_a_client_churning_the_table_leaves_others_served(daemon: Any) -> None:
    """A client that PUTs and DELETEs thousands of keys in a loop (the table grows, fills with
    tombstones and is rebuilt again and again), with keys of every length and LOOKUPs of absent,
    repeated and look-alike keys: a healthy client's put+get stays correct within its deadline and
    a reader's LOOKUP and GET stay exact."""
    mine = [os.urandom(32) for _ in range(200)]
    with (
        HealthProbe(daemon.socket) as probe,
        KvdClient(daemon.socket, namespace="churn", name="reader") as good,
    ):
        good.put_many([(k, k * 2) for k in mine], retention="long")
        with ThreadPoolExecutor(1) as pool:
            churn = pool.submit(client_process, _CHURN, daemon.socket, ",".join(k.hex() for k in mine), "4")
            rounds = 0
            while not churn.done():
                assert good.lookup(mine) == len(mine)
                assert good.get(mine[rounds % len(mine)]) == mine[rounds % len(mine)] * 2
                rounds += 1
                time.sleep(0.01)
            assert int(churn.result()) >= 3 and rounds >= 20
        probe.assert_healthy()
