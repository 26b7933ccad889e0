"""One client cannot pin the whole arena: the per-connection pin budget (``--client-quota``,
infera.kvd.budget) over its reservations, leases and LOOKUP holds.

Each daemon test runs a healthy client (tests/hostile.py) beside one that reserves without
sealing, holds everything, leases past its quota, or vanishes mid-frame at its quota, and requires it to be
served correct bytes within the deadline; the Store and PinBudget tests pin the rules themselves.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from hostile import HealthProbe, frame, hello, raw, read_reply, wait_rounds

from helpers import Daemon
from infera.kvd import keyspace as ks
from infera.kvd.arena import ALIGN
from infera.kvd.budget import PinBudget
from infera.kvd.chunk import Chunk
from infera.kvd.client import KvdClient, KvdFull, KvdQuota
from infera.kvd.process import wait_until
from infera.kvd.protocol import RETENTION_CODE
from infera.kvd.store import Store

SHORT, LONG = RETENTION_CODE["short"], RETENTION_CODE["long"]
ARENA = 64 << 20
CHUNK = 4096
ROUNDS = 200  # healthy rounds each test waits for beside the hostile client (a p99 over them)


def _stats(s: socket.socket, rid: int) -> dict:
    s.sendall(frame({"op": "STATS", "id": rid}))
    return read_reply(s)["stats"]


def _reserve_everything(s: socket.socket, n: int = ARENA // CHUNK) -> list:
    """The hostile client of session 31's finding: 16,384 reservations of 4 KiB (the whole 64 MiB
    arena), never written, never sealed."""
    keys = [b"empty-%d" % i for i in range(n)]
    s.sendall(frame({"op": "PUT", "id": 2, "keys": keys, "lengths": [CHUNK] * n}))
    return read_reply(s)["slots"]


def _client_row(stats: dict, name: str) -> dict:
    return next(c for c in stats["clients"] if c["name"] == name)


# -- daemon ----------------------------------------------------------------------------------------


def test_a_client_reserving_the_whole_arena_stops_at_its_quota(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "64M")  # default quota: half the arena
    with HealthProbe(d.socket) as probe:
        s = raw(d.socket, timeout=10)
        hello(s, namespace="hostile", name="hostile")
        slots = _reserve_everything(s)
        granted = [x for x in slots if isinstance(x, list)]
        assert len(granted) == ARENA // 2 // CHUNK
        assert slots[len(granted) :] == ["quota"] * (len(slots) - len(granted))
        # a healthy writer still finds half the arena: 8 MiB in one batch, read back exactly
        with KvdClient(d.socket, namespace="healthy", name="healthy-writer") as c:
            items = [(b"w%d" % i, bytes([i]) * (1 << 20)) for i in range(8)]
            assert c.put_many(items) == [True] * 8
            assert c.get_many([k for k, _ in items]) == [v for _, v in items]
        wait_rounds(probe, ROUNDS, timeout=30)
        st = _stats(s, 3)
        assert st["put_rejected_quota_total"] == len(slots) - len(granted)
        row = _client_row(st, "hostile")
        assert row["pinned_bytes"] == len(granted) * CHUNK == row["quota_bytes"]
        assert row["quota_refused"] == len(slots) - len(granted)
        refused = len(slots) - len(granted)
        assert st["warnings"] == [
            f"client hostile (pid {row['pid']}) had {refused} PUT keys refused for its pin quota: "
            "it pins 32.0 MiB of its 32.0 MiB (--client-quota)"
        ]
        s.close()
    probe.assert_healthy()
    assert "reached its pin budget" in d.log()


def test_without_the_quota_the_same_client_starves_the_others(start_daemon: Callable[..., Daemon]) -> None:
    """What the quota prevents (``--client-quota 100`` turns it off): the healthy write fails."""
    d = start_daemon("--max-bytes", "64M", "--client-quota", "100")
    s = raw(d.socket, timeout=10)
    hello(s, namespace="hostile", name="hostile")
    assert all(isinstance(x, list) for x in _reserve_everything(s))
    with KvdClient(d.socket, namespace="healthy") as c, pytest.raises(KvdFull) as err:
        c.put(b"w", b"x" * (1 << 20))
    assert not isinstance(err.value, KvdQuota)
    s.close()


def test_leases_count_once_are_never_refused_and_stop_the_clients_own_writes(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon("--max-bytes", "16M", "--client-quota", "25")  # 4 MiB a connection
    mib = 1 << 20
    data = {b"c%d" % i: bytes([i + 1]) * mib for i in range(6)}
    with HealthProbe(d.socket) as probe, KvdClient(d.socket, namespace="ns", name="reader") as c:
        for pair in (list(data.items())[i : i + 2] for i in range(0, 6, 2)):
            assert c.put_many(pair) == [True, True]  # sealed: pins nothing any more
        keys = list(data)
        assert c.lookup(keys) == 6
        assert _client_row(c.stats(), "reader")["pinned_bytes"] == 0
        first = c.lease(keys[:3])
        again = c.lease(keys[:3])  # the same three chunks: still 3 MiB pinned
        assert None not in first and None not in again
        assert _client_row(c.stats(), "reader")["pinned_bytes"] == 3 * mib
        # 3 MiB leased: one more 1 MiB reservation fits, a second in the same batch does not
        assert c.put_many([(b"n1", b"y" * mib), (b"n2", b"y" * mib)]) == [True, False]
        more = c.lease(keys[3:])  # leases are never refused, even past the quota
        assert None not in more
        with pytest.raises(KvdQuota):  # 6 MiB leased: no room to write at all
            c.put(b"n3", b"z" * mib)
        st = c.stats()
        row = _client_row(st, "reader")
        assert row["pinned_bytes"] == 6 * mib > row["quota_bytes"] and row["quota_refused"] == 2
        assert st["put_rejected_quota_total"] == 2
        assert any("reader" in w and "leases more than its pin quota" in w for w in st["warnings"])
        arena = c.arena
        for (_tok, off, length), key in zip([*first, *more], keys, strict=True):
            assert bytes(arena[off : off + length]) == data[key]
        # releasing gives the room back
        c.release([x[0] for x in [*first, *again, *more]])
        assert _client_row(c.stats(), "reader")["pinned_bytes"] == 0
        assert c.put_many([(b"n2", b"y" * mib), (b"n3", b"z" * mib)]) == [True, True]
        assert c.get_many([b"n1", b"n2", b"n3"]) == [b"y" * mib, b"y" * mib, b"z" * mib]
        wait_rounds(probe, ROUNDS, timeout=30)
    probe.assert_healthy()
    assert "over its pin budget" in d.log() and "reached its pin budget" in d.log()


def test_a_client_dropped_at_its_quota_gives_everything_back(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "64M")
    with HealthProbe(d.socket) as probe:
        for round_ in range(3):  # connect, pin half, vanish mid-frame: nothing accumulates
            s = raw(d.socket, timeout=10)
            hello(s, namespace="hostile", name=f"hostile-{round_}")
            assert "quota" in _reserve_everything(s)
            s.sendall(frame({"op": "PUT", "id": 9, "keys": [b"x"], "lengths": [CHUNK]})[:7])
            s.close()
        wait_rounds(probe, ROUNDS, timeout=30)
    probe.assert_healthy()
    with KvdClient(d.socket, namespace="healthy") as c:
        wait_until(lambda: c.stats()["arena_bytes_used"] < ARENA // 4, 10, "the reservations given back")
        items = [(b"w%d" % i, bytes([i]) * (1 << 20)) for i in range(24)]
        assert c.put_many(items) == [True] * 24  # more than half the arena: all given back


def _fill_and_hold(d: Daemon, hold_ms: int = 600_000) -> tuple[KvdClient, int, int]:
    """A client that fills a 16 MiB arena with sealed 4 KiB chunks (sealed: no reservation is
    left) and holds every one of them: (its client, chunks found, chunks held)."""
    h = KvdClient(d.socket, namespace="hostile", name="holder")
    n = (16 << 20) // CHUNK
    for first in range(0, n, 256):
        assert all(h.put_many([(b"h%d" % i, b"h" * CHUNK) for i in range(first, first + 256)]))
    count, held = h.hold([b"h%d" % i for i in range(n)], hold_ms)
    return h, count, held


def test_a_client_holding_everything_holds_only_its_quota(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "16M")
    h, count, held = _fill_and_hold(d)
    with h:
        assert count == (16 << 20) // CHUNK and held == count // 2
        st = h.stats()
        assert st["holds_refused_quota_total"] == count - held
        assert _client_row(st, "holder")["pinned_bytes"] == held * CHUNK
        with HealthProbe(d.socket) as probe:  # its writes evict the chunks that are not held
            wait_rounds(probe, ROUNDS, timeout=30)
        probe.assert_healthy()
        # the held half is all still there
        assert h.lookup([b"h%d" % i for i in range(held)]) == held


def test_without_the_quota_holds_starve_the_others(start_daemon: Callable[..., Daemon]) -> None:
    """What the quota prevents: with ``--client-quota 100`` the holds take the whole arena."""
    d = start_daemon("--max-bytes", "16M", "--client-quota", "100")
    h, count, held = _fill_and_hold(d)
    with h, KvdClient(d.socket, namespace="healthy") as c:
        assert held == count
        with pytest.raises(KvdFull):
            c.put(b"w", b"x" * (64 << 10))


def test_holds_stop_counting_when_they_end_and_a_leased_chunk_costs_nothing_more(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon("--max-bytes", "16M", "--client-quota", "25")  # 4 MiB
    mib = 1 << 20
    with KvdClient(d.socket, namespace="ns", name="holder") as c:
        keys = [b"c%d" % i for i in range(6)]
        for i in range(0, 6, 2):
            assert c.put_many([(k, bytes([9]) * mib) for k in keys[i : i + 2]]) == [True, True]
        leases = c.lease(keys[:2])  # 2 MiB leased
        assert c.hold(keys, 400) == (6, 4)  # the leased two cost nothing more: 4 held
        assert _client_row(c.stats(), "holder")["pinned_bytes"] == 4 * mib
        with pytest.raises(KvdQuota):
            c.put(b"new", b"n" * mib)
        wait_until(lambda: _client_row(c.stats(), "holder")["pinned_bytes"] == 2 * mib, 5, "holds ended")
        assert c.put(b"new", b"n" * mib)
        c.release([x[0] for x in leases])
        assert c.hold(keys, 60_000) == (6, 4)  # renewed: the same four
        assert c.hold(keys, 60_000) == (6, 4)
        assert _client_row(c.stats(), "holder")["pinned_bytes"] == 4 * mib


# -- Store and PinBudget ------------------------------------------------------------------------


def _sealed(store: Store, name: bytes, size: int = ALIGN) -> Chunk:
    res = store.reserve(ks.ikey(0, name), size, SHORT)
    assert res.chunk is not None, res.error
    store.seal(res.chunk)
    return res.chunk


def test_store_reserve_many_keeps_to_the_room_it_is_given() -> None:
    store = Store(64 * ALIGN)
    keys = [ks.ikey(0, b"k%d" % i) for i in range(6)]
    _sealed(store, b"k1")  # present: "exists", takes no room
    lengths = [2 * ALIGN, ALIGN, 2 * ALIGN, ALIGN, 3 * ALIGN, 0]
    got = [r.error or "ok" for r in store.reserve_many(keys, lengths, SHORT, room=4 * ALIGN)]
    assert got == ["ok", "exists", "ok", "quota", "quota", "ok"]
    assert store.c["put_rejected_quota_total"] == 2 and store.c["put_rejected_full_total"] == 0
    # room=None: no budget at all
    assert store.reserve(ks.ikey(0, b"big"), 40 * ALIGN, SHORT).chunk is not None


def test_store_lets_a_connection_that_pins_nothing_reserve_one_chunk_past_its_room() -> None:
    store = Store(64 * ALIGN)
    keys = [ks.ikey(0, b"k%d" % i) for i in range(3)]
    got = store.reserve_many(keys, [20 * ALIGN, ALIGN, ALIGN], SHORT, room=8 * ALIGN, idle=True)
    assert [r.error or "ok" for r in got] == ["ok", "quota", "quota"]
    # not idle: the same chunk is refused
    got = store.reserve_many([ks.ikey(0, b"x")], [20 * ALIGN], SHORT, room=8 * ALIGN)
    assert got[0].error == "quota"


def test_pin_budget_counts_each_leased_chunk_once() -> None:
    a, b = Chunk(b"a", 0, 100, SHORT), Chunk(b"b", 4096, 100, SHORT)
    budget = PinBudget(150)
    budget.lease(a)
    budget.lease(a)
    assert budget.used == 100 and budget.room == 50
    budget.lease(b)  # counted past the limit: leases are never refused
    assert budget.used == 200 and budget.room == -50
    budget.release(a)
    assert budget.used == 200
    budget.release(a)
    budget.release(b)
    assert budget.used == 0 and not budget.refs
    r = Chunk(b"r", 8192, 150, SHORT)
    budget.reserved(r)
    assert budget.room == 0
    budget.unreserved(r)
    budget.lease(a)
    budget.clear()
    assert budget.used == 0 and not budget.refs
    unlimited = PinBudget(None)  # --client-quota 100
    unlimited.lease(a)
    assert unlimited.room is None and not unlimited.over


def test_pin_budget_holds_a_prefix_renews_cheaply_and_expires() -> None:
    a, b, c, d = (Chunk(bytes([i]), 4096 * i, 100, SHORT) for i in range(4))
    budget = PinBudget(300)
    budget.lease(d)
    assert budget.hold([a, b, d, c], until=10.0, now=0.0) == 3  # d is leased already: free
    assert budget.used == 300 and c not in budget.held
    entries = len(budget.expiry)
    assert budget.hold([a, b], until=10.5, now=1.0) == 2  # within the slack: nothing written down
    assert len(budget.expiry) == entries and budget.held[a] == 10.0
    assert budget.hold([a], until=20.0, now=2.0) == 1  # moved on: written down again
    budget.expire(10.0)  # b's and d's holds end; a's was renewed, d stays leased
    assert set(budget.held) == {a} and budget.used == 200
    budget.release(d)
    assert budget.used == 100
    budget.expire(20.0)
    assert budget.used == 0 and not budget.refs and not budget.held
    # the same holds renewed many times leave a bounded list of ends
    for t in range(5000):
        budget.hold([a, b], until=30.0 + 2 * t, now=0.0)
    assert len(budget.expiry) <= 2 * len(budget.held) + 1024
    assert PinBudget(None).hold([a, b, c], until=1.0, now=0.0) == 3  # no limit
