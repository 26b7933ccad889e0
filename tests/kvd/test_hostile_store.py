"""Hostile clients against the RAM tier's index and the metrics endpoint (tests/hostile.py).

Each daemon test runs a healthy client on the same daemon while another one misbehaves, and
asserts that the healthy one is still served correct bytes within the deadline. The Store unit
tests that pin the structure making a refused write cheap are in test_store_queues.py.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable

import pytest
from hostile import HealthProbe, HoldingProbe, frame, hello, raw, read_reply

from helpers import Daemon, free_port
from infera.bench import procfs
from infera.kvd import metrics
from infera.kvd import protocol as P
from infera.kvd.arena import ALIGN
from infera.kvd.protocol import RETENTION_CODE

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
