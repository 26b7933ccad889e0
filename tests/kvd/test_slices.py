"""Big batches are handled a slice per loop turn (infera.kvd.slices): one request, one reply, in
order, checked in full first; and a client sending the biggest batches in a row no longer holds
the loop for a quarter of a second at a time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile import HealthProbe, client_process, frame, hello, raw, read_replies, read_reply

from helpers import Daemon
from infera.kvd import protocol as P
from infera.kvd.process import wait_until
from infera.kvd.slices import SLICE_ITEMS

BIG = 3 * SLICE_ITEMS + 17  # four slices, the last one short
FLOOD_S = 4.0  # how long the flooding client sends its biggest batches


def _keys(tag: str, n: int = BIG) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def test_a_big_batch_is_one_request_with_one_exact_reply(daemon: Daemon) -> None:
    keys = _keys("big")
    data = {k: os.urandom(64 + i % 200) for i, k in enumerate(keys)}
    with daemon.client(namespace="slices") as c:
        assert c.put_many(list(data.items())) == [True] * BIG  # PUT and SEAL, both sliced
        before = c.stats()["lookups_total"]
        assert c.get_many(keys) == list(data.values())  # GET and RELEASE, both sliced
        assert c.lookup(keys) == BIG
        gap = 2 * SLICE_ITEMS + 5  # a miss in the third slice ends the prefix there
        assert c.lookup([*keys[:gap], b"absent", *keys[gap:]]) == gap
        assert c.lookup([b"absent", *keys]) == 0
        assert c.stats()["lookups_total"] - before == 3  # a request counted once, not per slice
        assert c.delete(keys) == BIG
        assert c.lookup(keys) == 0
        assert [x["leases"] for x in c.stats()["clients"] if x["namespace"] == "slices"] == [0]


@pytest.mark.parametrize("n", [SLICE_ITEMS, SLICE_ITEMS + 1, 2 * SLICE_ITEMS, 2 * SLICE_ITEMS + 1])
def test_batches_at_the_slice_edges_come_back_whole(daemon: Daemon, n: int) -> None:
    keys = _keys(f"edge{n}", n)
    with daemon.client(namespace="edges") as c:
        slots = c.reserve(keys, [8] * n, retention="short")
        assert len(slots) == n and all(isinstance(x, tuple) for x in slots)
        for key, (_token, off) in zip(keys, slots, strict=True):
            c.arena[off : off + 8] = key[-8:].rjust(8, b".")
        c.seal([x[0] for x in slots], wait=True)
        items = c.lease(keys)
        assert [bytes(c.arena[i[1] : i[1] + i[2]]) for i in items] == [k[-8:].rjust(8, b".") for k in keys]
        c.release([i[0] for i in items])
        for miss in (0, SLICE_ITEMS - 1, SLICE_ITEMS, n - 1):  # the prefix ends on either side of an edge
            assert c.lookup([*keys[:miss], b"absent", *keys[miss:]]) == miss
        assert c.delete(keys) == n and c.lookup(keys) == 0


def test_frames_behind_a_big_request_see_all_of_it_in_order(daemon: Daemon) -> None:
    keys = _keys("order")
    with daemon.client(namespace="order") as c:
        c.put_many([(k, k) for k in keys])
    s = raw(daemon.socket)
    hello(s, namespace="order")
    s.sendall(
        frame({"op": "LOOKUP", "id": 2, "keys": keys})
        + frame({"op": "DELETE", "id": 3, "keys": keys})
        + frame({"op": "LOOKUP", "id": 4, "keys": keys})
        + frame({"op": "PING", "id": 5})
    )
    replies = read_replies(s, 4)
    assert [r["id"] for r in replies] == [2, 3, 4, 5]
    assert replies[0]["count"] == BIG and replies[1]["deleted"] == BIG and replies[2]["count"] == 0
    s.close()


def test_a_bad_item_in_a_late_slice_refuses_the_whole_request(daemon: Daemon) -> None:
    s = raw(daemon.socket)
    hello(s, namespace="bad")
    keys = _keys("bad")
    used = daemon.stats()["arena_bytes_used"]
    late = BIG - 3
    for rid, bad_keys, lengths in (
        (2, [*keys[:late], b"", *keys[late + 1 :]], [4096] * BIG),  # an empty key in slice four
        (3, [*keys[:late], b"k" * (P.MAX_KEY_LEN + 1), *keys[late + 1 :]], [4096] * BIG),
        (4, keys, [*([4096] * late), -1, *([4096] * (BIG - late - 1))]),  # a negative length
        (5, keys, [4096] * (BIG - 1)),  # one length short
    ):
        s.sendall(frame({"op": "PUT", "id": rid, "keys": bad_keys, "lengths": lengths}))
        reply = read_reply(s)
        assert reply["id"] == rid and reply["ok"] is False and reply["error"] == "bad_request", reply
    st = daemon.stats()
    assert st["arena_bytes_used"] == used  # nothing reserved by the slices before the bad item
    assert [x["reservations"] for x in st["clients"] if x["namespace"] == "bad"] == [0]
    s.sendall(frame({"op": "PING", "id": 9}))
    assert read_reply(s)["id"] == 9  # and the connection is still served
    s.close()


def test_a_client_gone_in_the_middle_of_a_big_put_leaves_nothing_behind(daemon: Daemon) -> None:
    used = daemon.stats()["arena_bytes_used"]
    with HealthProbe(daemon.socket) as probe:
        for _ in range(5):
            s = raw(daemon.socket)
            hello(s, namespace="gone")
            keys = _keys(f"gone{_}", 8 * SLICE_ITEMS)
            s.sendall(frame({"op": "PUT", "id": 2, "keys": keys, "lengths": [4096] * len(keys)}))
            s.close()  # before the reply, most likely while slices are still being handled
        probe_most = 65 * probe.size  # the probe rewrites 64 keys (and may hold one more reserved)
        wait_until(
            lambda: daemon.stats()["arena_bytes_used"] <= used + probe_most, 10, "reservations returned"
        )
        time.sleep(0.2)
    probe.assert_healthy()
    assert daemon.alive()


_FLOOD = """
    import sys, time
    from infera.kvd.client import KvdClient
    keys = [i.to_bytes(8, "big") * 4 for i in range(int(sys.argv[2]))]
    end = time.monotonic() + float(sys.argv[3])
    rounds = 0
    with KvdClient(sys.argv[1], namespace="flood", name="flood", timeout=30) as c:
        while time.monotonic() < end:
            c.put_many([(k, b"") for k in keys], retention="ephemeral")
            assert c.lookup(keys) == len(keys)
            assert c.delete(keys) == len(keys)
            rounds += 1
    print(rounds)
"""


def test_a_client_sending_the_biggest_batches_in_a_row_leaves_others_served(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    """Before slicing, a healthy client's p99 here was ~270 ms on the dev VM (each 65,536-key PUT
    held the loop ~0.2 s); now each turn handles one slice."""
    d = start_daemon("--max-bytes", "1G")  # 65,536 empty chunks take 256 MiB of 4 KiB slots
    with HealthProbe(d.socket) as probe:
        rounds = client_process(_FLOOD, d.socket, str(P.MAX_BATCH), str(FLOOD_S))
    assert int(rounds) >= 1  # the flood itself was served, whole batches
    probe.assert_healthy()


def test_a_big_get_waits_for_the_disk_tier_slice_by_slice(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    """Most of a big GET is on disk only: each slice waits for the tier's threads (the request's
    later frames wait behind it) and the one reply carries every chunk, exact."""
    d = start_daemon("--max-bytes", "16M", "--long-path", str(short_tmp / "long"), "--long-bytes", "256M")
    keys = _keys("disk")
    data = {k: os.urandom(4 << 10) for k in keys}  # 12 MiB: fits in RAM once the filler is gone
    filler = {k: os.urandom(4 << 10) for k in _keys("filler", 4096)}  # 16 MiB: pushes them out
    with d.client(namespace="disk") as c:
        items = [*data.items(), *filler.items()]
        for i in range(0, len(items), 512):
            assert all(c.put_many(items[i : i + 512]))
            wait_until(
                lambda n=min(i + 512, len(items)): (
                    (t := c.stats()["tiers"]["long"])["queued_writes"] == 0 and t["chunks"] >= n
                ),
                30,
                "chunk files written",
            )
        hits = c.stats()["tiers"]["long"]["hits"]
        assert c.get_many(keys) == list(data.values())
        assert c.stats()["tiers"]["long"]["hits"] - hits >= SLICE_ITEMS  # slices did wait for disk
        assert c.lookup(keys) == BIG
        hits = c.stats()["tiers"]["long"]["hits"]
    # a client naming the daemon's own internal fields gets nothing out of it (the filler is on
    # disk only now, so this GET waits for the tier too)
    s = raw(d.socket)
    hello(s, namespace="disk")
    few = list(filler)[:8]
    s.sendall(frame({"op": "GET", "id": 7, "keys": few, "_sliced": 1, "_more": True}))
    reply = read_reply(s)
    assert reply["id"] == 7 and reply["ok"] and all(item is not None for item in reply["items"])
    s.close()
    assert d.alive() and d.stats()["tiers"]["long"]["hits"] > hits
