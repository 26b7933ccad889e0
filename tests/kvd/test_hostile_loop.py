"""The request loop under hostile clients: each one may cost its own connection, never the others.

Every test runs a :class:`hostile.HealthProbe` (a healthy engine doing put+get and checking bytes)
on the same daemon while one client misbehaves, then asserts the probe was served correct bytes
within the deadline. Bounds are named constants; they are loose enough for a loaded 2-core VM and
far below what the misbehaviour cost before the loop was hardened (noted next to each).
"""

from __future__ import annotations

import re
import resource
import socket
import time
from collections.abc import Callable

import pytest
from hostile import (
    HealthProbe,
    frame,
    hello,
    pipeline,
    raw,
    read_replies,
    read_reply,
    read_reply_fds,
    wait_rounds,
)

from helpers import Daemon
from infera.bench import procfs
from infera.kvd import protocol as P
from infera.kvd.client import KvdClient
from infera.kvd.namespaces import NS_IDS, NamespaceTable
from infera.kvd.snapshot import STATS_MAX_CLIENTS

MiB = 1 << 20
RSS_GROWTH_MAX = 64 * MiB  # daemon memory a flood may add (was ~1 GB for items 5 and 12)


# -- item 2: a client that never reads must not freeze the loop ------------------------------------
STUCK_PINGS = 1000  # unread replies before the HELLO (~278 filled the socket and froze the daemon)
STUCK_HOLD_S = 2.0  # how long the stuck client stays connected without reading


def test_a_client_that_never_reads_costs_only_its_own_connection(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        pings = b"".join(frame({"op": "PING", "id": i}) for i in range(1, STUCK_PINGS + 1))
        s.sendall(pings + frame({"op": "HELLO", "id": 0, "versions": [P.PROTOCOL_VERSION], "namespace": "x"}))
        time.sleep(STUCK_HOLD_S)  # an engine stopped with SIGSTOP: it reads nothing
    probe.assert_healthy()
    # Nothing was lost meanwhile: every reply in order, the arena fd on the HELLO reply.
    s.settimeout(5)
    ids = [read_reply(s)["id"] for _ in range(STUCK_PINGS)]
    assert ids == list(range(1, STUCK_PINGS + 1))
    reply, nfds = read_reply_fds(s)
    assert reply["ok"] and reply["arena_fd"] and nfds == 1
    s.close()


# -- item 5: queued replies are capped per connection -------------------------------------------
FLOOD_BYTES = 1 * MiB  # of pipelined STATS requests (18 bytes each, ~1.6 KB replies): ~93 MB once


def test_a_reply_flood_is_capped_per_connection_and_resumes(daemon: Daemon) -> None:
    request = frame({"op": "STATS", "id": 7})
    flood = request * (FLOOD_BYTES // len(request))
    base = procfs.rss_bytes(daemon.pid)
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        sent = pipeline(s, flood, stall_s=1.0)  # never reads a reply
        time.sleep(0.5)
        grown = procfs.rss_bytes(daemon.pid) - base
        paused = daemon.stats().get("output_paused_total")
    probe.assert_healthy()
    assert grown < RSS_GROWTH_MAX, f"daemon grew by {grown / MiB:.0f} MiB"
    assert paused == 1
    assert len(re.findall(r"is not reading its replies", daemon.log())) == 1  # once per connection
    # It catches up: once it reads, the daemon reads its requests again and answers every one.
    replies = read_replies(s, sent // len(request), timeout=30, decode=False)
    assert len(replies) == sent // len(request)
    s.close()


SPREAD = 12  # connections flooding STATS at once, none reading (~210 MB of replies once)
SPREAD_BYTES = 192 << 10  # of requests each
QUEUED_MAX = 40 * MiB  # replies queued for all of them together (the budget, plus one reply)


def test_reply_floods_of_many_connections_share_one_budget(daemon: Daemon) -> None:
    request = frame({"op": "STATS", "id": 7})
    flood = request * (SPREAD_BYTES // len(request))
    base = procfs.rss_bytes(daemon.pid)
    with HealthProbe(daemon.socket) as probe:
        hostile = [raw(daemon.socket) for _ in range(SPREAD)]
        for s in hostile:
            pipeline(s, flood, stall_s=0.5)
        wait_rounds(probe, 300)
        grown = procfs.rss_bytes(daemon.pid) - base
        st = daemon.stats()
        for s in hostile:
            s.close()
    probe.assert_healthy()
    assert grown < RSS_GROWTH_MAX, f"daemon grew by {grown / MiB:.0f} MiB"
    assert st["output_dropped_total"] >= 1
    assert st["output_queued_bytes"] <= QUEUED_MAX


# -- item 6: out of descriptors, accept backs off ------------------------------------------------
FD_HEADROOM = 8  # descriptors left to the daemon before it runs out
HOSTILE_CONNECTIONS = 40  # more than the headroom: the rest wait in the listen backlog
EMFILE_WINDOW_S = 1.5
CPU_MAX_FRACTION = 0.35  # of one core over the window (was ~1.0: a busy loop)
LOG_GROWTH_MAX = 8 << 10  # bytes of log over the window (was 8-10 MB/s)
RECOVER_S = 5.0  # a new client connects within this once descriptors are back


def test_out_of_descriptors_backs_off_logs_once_and_recovers(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "64M", "--busy-poll-us", "0")
    with HealthProbe(d.socket) as probe:
        _soft, hard = resource.prlimit(d.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (procfs.open_fds(d.pid) + FD_HEADROOM, hard))
        hostile = []
        for _ in range(HOSTILE_CONNECTIONS):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(d.socket)
            except BlockingIOError:
                pass
            hostile.append(s)
        time.sleep(0.3)  # it has run out by now
        cpu0, log0 = procfs.cpu_seconds(d.pid), d.log_path.stat().st_size
        time.sleep(EMFILE_WINDOW_S)
        cpu = procfs.cpu_seconds(d.pid) - cpu0
        logged = d.log_path.stat().st_size - log0
        for s in hostile:
            s.close()
        deadline = time.monotonic() + RECOVER_S
        while True:
            try:
                with KvdClient(d.socket, namespace="late", timeout=1) as c:
                    assert c.put(b"k", b"v") and c.get(b"k") == b"v"
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    probe.assert_healthy()
    assert cpu < CPU_MAX_FRACTION * EMFILE_WINDOW_S, f"daemon used {cpu:.2f} s of CPU out of descriptors"
    assert logged < LOG_GROWTH_MAX, f"{logged} bytes of log in {EMFILE_WINDOW_S} s"
    assert d.stats()["accept_errors_total"] >= 1
    assert d.log().count("accept failed") == 1  # one line for the whole episode


# -- item 7: namespace ids are counted, reused and capped per connection -------------------------
HELLO_FLOOD = 66_000  # HELLOs with new namespaces on one connection (ids stopped at 65,535)
HELLO_BATCH = 2000
NS_PER_CONNECTION_MAX = 8  # namespaces one connection may use
CHURN = 300  # engines that connect with a namespace of their own and leave
IDS_IN_USE_MAX = 16  # namespace ids left in use after the churn


def test_one_connection_cannot_exhaust_namespace_ids(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        ok = 0
        for start in range(0, HELLO_FLOOD, HELLO_BATCH):
            batch = b"".join(
                frame({"op": "HELLO", "id": i, "versions": [1], "namespace": f"ns-{i}", "want_arena": False})
                for i in range(start, start + HELLO_BATCH)
            )
            s.sendall(batch)
            ok += sum(1 for r in read_replies(s, HELLO_BATCH, timeout=20) if r["ok"])
        # a new engine still gets in, with a namespace of its own
        with KvdClient(daemon.socket, namespace="new-engine", timeout=5) as c:
            assert c.put(b"k", b"fresh") and c.get(b"k") == b"fresh"
        st = daemon.stats()
        s.close()
    probe.assert_healthy()
    assert ok <= NS_PER_CONNECTION_MAX
    assert st["namespace_refused_total"] >= HELLO_FLOOD - NS_PER_CONNECTION_MAX
    assert st["namespace_ids_in_use"] <= IDS_IN_USE_MAX


def test_namespace_ids_are_freed_but_never_while_chunks_use_them(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        with KvdClient(daemon.socket, namespace="writer") as w:
            assert w.put(b"k", b"writer's bytes")
        for i in range(CHURN):
            with KvdClient(daemon.socket, namespace=f"churn-{i}", want_arena=False, timeout=5) as c:
                assert c.lookup([b"k"]) == 0  # never sees another namespace's chunk
        in_use = daemon.stats()["namespace_ids_in_use"]
        # the writer's id is kept while its chunk is in RAM: it comes back to its bytes
        with KvdClient(daemon.socket, namespace="writer") as w:
            assert w.get(b"k") == b"writer's bytes"
        with KvdClient(daemon.socket, namespace="reader") as r:
            assert r.get(b"k") is None
    probe.assert_healthy()
    assert in_use <= IDS_IN_USE_MAX, f"{in_use} namespace ids in use after {CHURN} engines left"


def test_namespace_table_reclaims_only_ids_no_chunk_refers_to() -> None:
    table = NamespaceTable()
    held = {0: b"\x00\x00chunk"}  # id 0 still keys a chunk in RAM
    for i in range(NS_IDS):
        nid = table.acquire(f"ns-{i}")
        table.mark_used(nid)  # each ran a PUT
        table.release(nid)
    with pytest.raises(ValueError, match="too many namespaces"):
        table.acquire("one-more")  # no in_use given: nothing may be reclaimed
    nid = table.acquire("one-more", lambda: held.values())
    assert nid != 0 and table.ids["ns-0"] == 0 and len(table) == 2
    table.reclaimable_used = False  # with a long tier, a used id is never reused
    table.mark_used(nid)
    table.release(nid)
    assert table.ids["one-more"] == nid


# -- item 8: client metadata is bounded, STATS always fits ----------------------------------------
HUGE = 9 * MiB  # a name this long made every STATS reply exceed the frame cap
MAX_CLIENTS = STATS_MAX_CLIENTS + 16  # connections with every field at its bound
STATS_REPLY_MAX = 5 * MiB  # the STATS reply with all of them (13+ MB would not fit one frame once)
WIDE = "\U0001f600"  # 4 bytes of UTF-8 per character: the worst case for reply size


def test_client_metadata_is_bounded_and_stats_always_fits(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        for _ in range(2):
            assert hello(s, name="n" * HUGE, want_arena=False)["error"] == "bad_request"
        bad_hellos: list[dict[str, object]] = [
            {"namespace": "n" * 2000},
            {"hash_fingerprint": "f" * 1000},
            {"hash_settings": {f"k{i}": i for i in range(1000)}},
            {"hash_settings": {"algo": "a" * 10_000}},
            {"hash_settings": {"algo": {"nested": [1, 2]}}},
        ]
        for fields in bad_hellos:
            assert hello(s, want_arena=False, **fields)["error"] == "bad_request", fields
        assert hello(s, name="n" * 60_000, model="m" * 60_000, want_arena=False)["ok"]
        s.sendall(
            frame({"op": "REPORT", "id": 9, "report": {"counters": {f"c{i}": i for i in range(10_000)}}})
        )
        assert read_reply(s)["error"] == "bad_request"  # a map that long is no request
        counters = {"c" * 1000: 1, **{f"c{i}": i for i in range(500)}}
        s.sendall(frame({"op": "REPORT", "id": 9, "report": {"counters": counters}}))
        assert read_reply(s)["ok"]
        st = daemon.stats()
        me = next(c for c in st["clients"] if c["name"].startswith("n"))
        assert len(me["name"]) == P.MAX_TEXT_LEN and len(me["model"]) == P.MAX_TEXT_LEN
        assert (
            len(me["counters"]) == P.MAX_REPORT_COUNTERS
            and me["counters_omitted"] == 501 - P.MAX_REPORT_COUNTERS
        )

        # many clients, every field at its bound: STATS still fits and says what it left out
        crowd = []
        for i in range(MAX_CLIENTS):
            c = raw(daemon.socket)
            reply = hello(
                c,
                want_arena=False,
                namespace=f"{i:04d}" + WIDE * (P.MAX_NAMESPACE_LEN - 4),
                name=WIDE * P.MAX_TEXT_LEN,
                role=WIDE * P.MAX_TEXT_LEN,
                model=WIDE * P.MAX_TEXT_LEN,
                data_path=WIDE * P.MAX_TEXT_LEN,
                hash_fingerprint=WIDE * P.MAX_FINGERPRINT_LEN,
                hash_settings={
                    f"{k:02d}" + WIDE * (P.MAX_SETTING_NAME_LEN - 2): WIDE * P.MAX_TEXT_LEN
                    for k in range(P.MAX_HASH_SETTINGS)
                },
            )
            assert reply["ok"], reply
            counters = {
                f"{k:03d}" + WIDE * (P.MAX_COUNTER_NAME_LEN - 3): 2**63 for k in range(P.MAX_REPORT_COUNTERS)
            }
            text = WIDE * P.MAX_REPORT_TEXT
            report = {
                "counters": counters,
                "data_path": text,
                "fallback_reason": text,
                "requested_path": text,
            }
            c.sendall(frame({"op": "REPORT", "id": 2, "report": report}))
            assert read_reply(c)["ok"]
            crowd.append(c)
        s.sendall(frame({"op": "STATS", "id": 3}))
        (body,) = read_replies(s, 1, decode=False)  # decoded below, off the probe's clock
        wait_rounds(probe, 200)
        for c in crowd:
            c.close()
        s.close()
    probe.assert_healthy()
    assert len(body) < STATS_REPLY_MAX
    st = P.decode_body(body)["stats"]
    assert st["clients_connected"] == MAX_CLIENTS + 2  # the crowd, s and the probe
    assert len(st["clients"]) + st["clients_omitted"] == st["clients_connected"]
    assert st["clients_omitted"] > 0


# -- item 12: decoding and buffered input are bounded ---------------------------------------------
EMPTY_ARRAYS = 240  # arrays of 65,536 empty arrays in one frame (~15.7 MB; 1.25 GB and 4 s once)
REPLY_DEADLINE_S = 2.0
PARKED = 10  # connections parked just short of a full frame (960 MB for 60 of them once)
PARKED_BODY = P.MAX_FRAME - 64
BUFFERED_MAX = 32 * MiB  # partial frames the daemon holds for all connections together
# What holding them may cost: the budget and some slack for one read. With glibc's moving mmap
# threshold (before the daemon pinned it) the same run measured a 48 to 65 MiB peak.
PARKED_PEAK_MAX = BUFFERED_MAX + 8 * MiB


def test_a_frame_of_empty_arrays_is_refused_cheaply(daemon: Daemon) -> None:
    inner = b"\xdd" + (65536).to_bytes(4, "big") + b"\x90" * 65536
    head = b"\x83\xa2op\xa4PING\xa2id\x05\xa1x" + b"\xdc" + EMPTY_ARRAYS.to_bytes(2, "big")
    body = head + inner * EMPTY_ARRAYS
    assert len(body) <= P.MAX_FRAME
    peak = procfs.peak_rss_bytes(daemon.pid)
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        hello(s, want_arena=False)
        t0 = time.monotonic()
        s.sendall(P.HEADER.pack(len(body)) + body)
        reply = read_reply(s)
        took = time.monotonic() - t0
        s.close()
        wait_rounds(probe)
    probe.assert_healthy()
    grown = procfs.peak_rss_bytes(daemon.pid) - peak
    assert reply["ok"] is False and reply["error"] == "bad_request"
    assert took < REPLY_DEADLINE_S
    assert grown < RSS_GROWTH_MAX, f"daemon peak grew by {grown / MiB:.0f} MiB"


def test_parked_partial_frames_share_one_input_budget(daemon: Daemon) -> None:
    partial = P.HEADER.pack(PARKED_BODY) + b"\x00" * (PARKED_BODY - 1)  # one byte short
    peak = procfs.peak_rss_bytes(daemon.pid)
    with HealthProbe(daemon.socket) as probe:
        parked = []
        for _ in range(PARKED):
            s = raw(daemon.socket, timeout=10)
            pipeline(s, partial, stall_s=2.0)
            parked.append(s)
        grown = procfs.peak_rss_bytes(daemon.pid) - peak
        # a legitimate big request still goes through: the stalest parked frame makes room
        keys = [i.to_bytes(8, "big") * 8 for i in range(P.MAX_BATCH)]  # 65,536 keys of 64 bytes
        with KvdClient(daemon.socket, namespace="big", want_arena=False, timeout=10) as c:
            assert c.lookup(keys) == 0
        st = daemon.stats()
        for s in parked:
            s.close()
        wait_rounds(probe)
    probe.assert_healthy()
    assert grown < PARKED_PEAK_MAX, f"parked frames grew the daemon's peak by {grown / MiB:.0f} MiB"
    assert st["input_budget_drops_total"] >= PARKED - 2
    assert st["input_buffered_bytes"] <= BUFFERED_MAX
