"""Hostile clients against the RAM tier's index and the metrics endpoint (tests/hostile.py).

Each daemon test runs a healthy client on the same daemon while another one misbehaves, and
asserts that the healthy one is still served correct bytes within the deadline. The Store unit
tests below pin the structure that makes refusing a write cheap.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from hostile import HealthProbe, HoldingProbe, frame, hello, raw, read_reply
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import Daemon, free_port
from infera.bench import procfs
from infera.kvd import keyspace as ks
from infera.kvd import metrics
from infera.kvd import protocol as P
from infera.kvd.arena import ALIGN, align_up
from infera.kvd.protocol import RETENTION_CODE
from infera.kvd.store import BUSY, GONE, HELD, IN_LRU, Chunk, Store

EPHEMERAL, SHORT, LONG = (RETENTION_CODE[r] for r in ("ephemeral", "short", "long"))

# A full batch refused on an arena whose every chunk is leased or held: O(keys) is about 0.2 s
# here (decode, 65,536 dict lookups, encode); O(keys x chunks) was minutes.
REFUSAL_DEADLINE_S = 2.0
REFUSAL_SOCKET_TIMEOUT_S = 10.0  # how long the test waits at all before calling it a freeze
# Store alone: 65,536 refusals with 4,096 chunks in use (a few microseconds each).
STORE_REFUSAL_S = 1.5
# Metrics endpoint: what a real scrape may take while 300 idle connections sit there, and how
# many threads the daemon may add for them (none: one thread serves every connection).
IDLE_CONNECTIONS = 300
SCRAPE_DEADLINE_S = 2.0
EXTRA_THREADS = 2
CLOSE_MARGIN_S = 3.0  # slack on top of metrics.CONN_TIMEOUT_S before an idle connection is closed


def _rounds(probe: HealthProbe, n: int = 50, timeout: float = 10.0) -> None:
    """Let the healthy client complete ``n`` more rounds while the hostile one is still there."""
    want = len(probe.latencies) + n
    deadline = time.monotonic() + timeout
    while len(probe.latencies) < want and not probe.errors and time.monotonic() < deadline:
        time.sleep(0.01)


def _stats(s: socket.socket, rid: int) -> dict:
    s.sendall(frame({"op": "STATS", "id": rid}))
    return read_reply(s)["stats"]


# -- item 9: refusing when nothing can be evicted costs O(keys) ---------------------------------


@pytest.mark.parametrize("how", ["lease", "hold"])
def test_full_batch_on_an_arena_in_use_is_refused_at_once(
    start_daemon: Callable[..., Daemon], how: str
) -> None:
    # one connection may pin the whole arena here (the quota has tests of its own: test_quota.py)
    d = start_daemon("--max-bytes", "16M", "--client-quota", "100")
    fill = [b"fill-%d" % i for i in range(5000)]
    batch = [b"more-%d" % i for i in range(P.MAX_BATCH)]
    batch_frame = frame({"op": "PUT", "id": 6, "keys": batch, "lengths": [ALIGN] * len(batch)})
    with HoldingProbe(d.socket) as probe:
        s = raw(d.socket, timeout=REFUSAL_SOCKET_TIMEOUT_S)
        hello(s, namespace="hostile", name="hostile")
        # fill what the probe left with 4 KiB chunks (~3,968 of them) ...
        s.sendall(frame({"op": "PUT", "id": 2, "keys": fill, "lengths": [ALIGN] * len(fill)}))
        slots = read_reply(s)["slots"]
        tokens = [slot[0] for slot in slots if isinstance(slot, list)]
        assert len(tokens) > 3000 and slots[-1] == "full"
        s.sendall(frame({"op": "SEAL", "id": 3, "tokens": tokens}))
        assert read_reply(s)["sealed"] == len(tokens)
        # ... and make every one of them unevictable
        mine = fill[: len(tokens)]
        if how == "lease":
            s.sendall(frame({"op": "GET", "id": 4, "keys": mine}))
            assert all(item is not None for item in read_reply(s)["items"])
        else:
            s.sendall(frame({"op": "LOOKUP", "id": 4, "keys": mine, "hold_ms": 600_000}))
            assert read_reply(s)["count"] == len(mine)
        before = _stats(s, 5)
        assert before["arena_bytes_used"] == before["arena_bytes_capacity"]
        t0 = time.monotonic()
        s.sendall(batch_frame)
        reply = read_reply(s)
        took = time.monotonic() - t0
        assert took <= REFUSAL_DEADLINE_S, f"refusing {len(batch)} keys took {took:.2f} s"
        assert reply["slots"] == ["full"] * len(batch)
        after = _stats(s, 7)
        assert after["put_rejected_full_total"] - before["put_rejected_full_total"] == len(batch)
        # the structure: each chunk in use was set aside at most once, not once per key
        assert after["evict_skipped_total"] <= before["chunks"]
        assert after["chunks_parked"] <= after["chunks"]
        _rounds(probe, 300)  # the batch stalls the loop once (~0.1 s): p99 is over many rounds
        s.close()
    probe.assert_healthy()


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


# -- item 16: idle scrapers cost no threads and cannot lock a real scrape out -------------------


def test_idle_metrics_connections_are_bounded(start_daemon: Callable[..., Daemon]) -> None:
    port = free_port()
    d = start_daemon("--max-bytes", "64M", "--metrics-port", str(port))
    with HealthProbe(d.socket) as probe:
        base = procfs.threads(d.pid)
        opened = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(IDLE_CONNECTIONS)]
        time.sleep(0.3)
        threads = procfs.threads(d.pid)
        assert threads <= base + EXTRA_THREADS, f"{threads} threads with idle scrapers (was {base})"
        t0 = time.monotonic()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_DEADLINE_S).read()
        assert time.monotonic() - t0 <= SCRAPE_DEADLINE_S
        assert b"# TYPE kvd_sets_total counter" in body
        over_cap = int(body.split(b"\nkvd_metrics_closed_over_cap_total ")[1].split()[0])
        assert over_cap >= IDLE_CONNECTIONS - metrics.MAX_CONNECTIONS
        # every idle connection is closed by the daemon: the oldest at once (over the cap), the
        # rest when their time is up
        deadline = opened + metrics.CONN_TIMEOUT_S + CLOSE_MARGIN_S
        for conn in idle:
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                assert conn.recv(1) == b""
            except ConnectionResetError:
                pass
            conn.close()
        assert procfs.threads(d.pid) <= base + EXTRA_THREADS
    probe.assert_healthy()


def test_metrics_replies_to_a_client_that_shuts_its_side(start_daemon: Callable[..., Daemon]) -> None:
    port = free_port()
    d = start_daemon("--max-bytes", "8M", "--metrics-port", str(port))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.0 200 OK") and b"kvd_chunks " in data
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /nope HTTP/1.0\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.0 404")
    assert d.alive()


# -- Store units -----------------------------------------------------------------------------------


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


def test_lookup_storm_on_a_full_arena_keeps_evictions_cheap(start_daemon: Callable[..., Daemon]) -> None:
    """A client LOOKUPs all of its chunks again and again (every one of them gets its second
    chance bit), churns deletes (stale queue entries), and PUTs new chunks into the full arena
    (each one an eviction through a queue of chunks that all want a second chance). Its PUTs stay
    fast, and the healthy client next to it is served correct bytes throughout."""
    d = start_daemon("--max-bytes", "32M")
    mine = [b"storm-%d" % i for i in range(7000)]
    with HealthProbe(d.socket) as probe:
        s = raw(d.socket, timeout=REFUSAL_SOCKET_TIMEOUT_S)
        hello(s, namespace="hostile", name="hostile")
        s.sendall(
            frame({"op": "PUT", "id": 2, "keys": mine, "lengths": [0] * len(mine), "retention": "ephemeral"})
        )
        tokens = [slot[0] for slot in read_reply(s)["slots"] if isinstance(slot, list)]
        s.sendall(frame({"op": "SEAL", "id": 3, "tokens": tokens}))
        read_reply(s)
        rid, worst, fresh = 10, 0.0, 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            s.sendall(frame({"op": "LOOKUP", "id": rid, "keys": mine}))
            read_reply(s)
            batch = [b"fresh-%d" % (fresh + i) for i in range(500)]
            fresh += len(batch)
            t0 = time.monotonic()
            s.sendall(
                frame(
                    {
                        "op": "PUT",
                        "id": rid + 1,
                        "keys": batch,
                        "lengths": [0] * len(batch),
                        "retention": "ephemeral",
                    }
                )
            )
            slots = read_reply(s)["slots"]
            worst = max(worst, time.monotonic() - t0)
            got = [slot[0] for slot in slots if isinstance(slot, list)]
            s.sendall(frame({"op": "SEAL", "id": rid + 2, "tokens": got}))
            read_reply(s)
            s.sendall(frame({"op": "DELETE", "id": rid + 3, "keys": batch[::2]}))
            read_reply(s)
            rid += 4
        st = _stats(s, rid)
        assert st["evictions_total"] > 0 and st["chunks"] <= 8192
        assert worst <= REFUSAL_DEADLINE_S, f"a PUT of 500 keys into the full arena took {worst:.2f} s"
        _rounds(probe, 100)
        s.close()
    probe.assert_healthy()
