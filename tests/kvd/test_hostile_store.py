"""Hostile clients against the RAM tier's index and the metrics endpoint (tests/hostile.py).

Each daemon test runs a healthy client on the same daemon while another one misbehaves, and
asserts that the healthy one is still served correct bytes within the deadline. The Store unit
tests below pin the structure that makes refusing a write cheap.
"""

from __future__ import annotations

import time

import pytest
from hostile import HealthProbe, frame, hello, raw, read_reply

from helpers import Daemon
from infera.kvd.arena import ALIGN
from infera.kvd.protocol import RETENTION_CODE
from infera.kvd.store import Chunk, Store

EPHEMERAL, SHORT, LONG = (RETENTION_CODE[r] for r in ("ephemeral", "short", "long"))


def _rounds(probe: HealthProbe, n: int = 50, timeout: float = 10.0) -> None:
    """Let the healthy client complete ``n`` more rounds while the hostile one is still there."""
    want = len(probe.latencies) + n
    deadline = time.monotonic() + timeout
    while len(probe.latencies) < want and not probe.errors and time.monotonic() < deadline:
        time.sleep(0.01)


# -- item 13: a PUT reserves all its keys or none ----------------------------------------------


def test_put_with_a_bad_length_reserves_nothing(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        hello(s, namespace="shared", name="hostile")
        s.sendall(frame({"op": "PUT", "id": 2, "keys": [b"a", b"b", b"c"], "lengths": [ALIGN, ALIGN, -5]}))
        reply = read_reply(s)
        assert reply["ok"] is False and reply["error"] == "bad_request"
        # a length larger than the arena is a slot, not an error; the rest of the PUT stands
        s.sendall(frame({"op": "PUT", "id": 3, "keys": [b"big", b"small"], "lengths": [1 << 40, 10]}))
        slots = read_reply(s)["slots"]
        assert slots[0] == "too_large" and isinstance(slots[1], list)
        s.sendall(frame({"op": "ABORT", "id": 4, "tokens": [slots[1][0]]}))
        assert read_reply(s)["aborted"] == 1
        # the hostile connection stays open; the keys it tried are free for everyone
        with daemon.client(namespace="shared") as other:
            assert other.put_many([(b"a", b"A" * ALIGN), (b"b", b"B" * ALIGN)]) == [True, True]
            assert other.get(b"a") == b"A" * ALIGN and other.get(b"b") == b"B" * ALIGN
            (mine,) = [c for c in other.stats()["clients"] if c["name"] == "hostile"]
            assert mine["reservations"] == 0
        s.sendall(frame({"op": "PING", "id": 5}))
        assert read_reply(s)["pong"] is True
        _rounds(probe)
        s.close()
    probe.assert_healthy()


# -- Store units -----------------------------------------------------------------------------------


def _sealed(store: Store, name: bytes, retention: int = SHORT, size: int = ALIGN) -> Chunk:
    res = store.reserve(Store.ikey(0, name), size, retention)
    assert res.chunk is not None, res.error
    store.seal(res.chunk)
    return res.chunk


def test_store_reserve_many_rolls_back_when_something_raises() -> None:
    store = Store(4 * ALIGN)
    _sealed(store, b"old")
    used = store.alloc.used

    def boom(chunk: Chunk, reason: str) -> None:
        raise RuntimeError("a tier hook failed")

    store.on_drop = boom
    keys = [Store.ikey(0, b"n%d" % i) for i in range(4)]  # the 4th needs an eviction: boom
    with pytest.raises(RuntimeError):
        store.reserve_many(keys, [ALIGN] * 4, SHORT)
    assert not store.pending and store.alloc.used == used
    assert store.c["put_rolled_back_total"] == 3
    store.on_drop = None
    assert all(r.chunk is not None for r in store.reserve_many(keys[:3], [ALIGN] * 3, SHORT))
