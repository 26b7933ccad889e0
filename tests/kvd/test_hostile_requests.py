"""Requests docs/protocol.md does not allow, from a hostile client, while a healthy one is served.

Each test runs a :class:`hostile.HealthProbe` on the same daemon: the bad requests are refused
(``bad_request``, the connection kept, as protocol.md says), the healthy client gets correct bytes
within the deadline, and what the daemon then shows (STATS, its log) is sound.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from hostile import HealthProbe, frame, hello, pipeline, raw, read_reply, wait_rounds

from helpers import Daemon
from infera.kvd import protocol as P
from infera.kvd.netio import INPUT_BUDGET_BYTES


def _refused(reply: dict[str, Any], needle: str) -> None:
    assert reply["ok"] is False and reply["error"] == "bad_request", reply
    assert needle in reply["message"], reply


def _still_served(s: Any, rid: int = 99) -> None:
    """The connection survived: a good PING on it is answered."""
    s.sendall(frame({"op": "PING", "id": rid}))
    reply = read_reply(s)
    assert reply == {"id": rid, "ok": True, "pong": True, "server_version": reply["server_version"]}


def test_a_request_id_must_be_an_integer(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        for rid in ("7", 7.0, None, True, [7]):
            s.sendall(frame({"op": "PING", "id": rid}))
            reply = read_reply(s)
            _refused(reply, "'id' must be an integer")
            assert reply["id"] == 0  # never echoed back: a bool too (isinstance(True, int))
        s.sendall(frame({"op": "PING"}))
        _refused(read_reply(s), "a request needs an integer 'id'")
        s.sendall(frame({"op": "PING", "id": "x", "noreply": True}))  # refused without a reply
        _still_served(s)
        assert hello(s, want_arena=False)["ok"] is True
        s.sendall(frame({"op": "RELEASE", "leases": [], "noreply": True}))  # noreply: no id needed
        big = [i.to_bytes(8, "big") for i in range(3000)]  # a batch handled in slices
        s.sendall(frame({"op": "LOOKUP", "id": "big", "keys": big}))
        _refused(read_reply(s), "'id' must be an integer")
        s.sendall(frame({"op": "LOOKUP", "id": 5, "keys": big}))
        assert read_reply(s) == {"id": 5, "ok": True, "count": 0}
        _still_served(s)
        s.close()
        wait_rounds(probe)
    probe.assert_healthy()


def test_hello_needs_versions_and_a_pid_that_is_one(daemon: Daemon) -> None:
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        for bad in ({}, {"versions": []}, {"versions": "1"}, {"versions": [True]}):
            s.sendall(frame({"op": "HELLO", "id": 1, "want_arena": False, **bad}))
            _refused(read_reply(s), "'versions' must be a non-empty list of integers")
        for pid in (2**64 - 1, 2**31, 0, -5):
            _refused(hello(s, want_arena=False, pid=pid), "'pid' must be a whole number from 1 to")
        _refused(hello(s, want_arena=False, chunk_tokens=2**40), "'chunk_tokens' must be a whole number")
        _still_served(s)
        assert hello(s, want_arena=False, pid=2**31 - 1, name="max-pid")["ok"] is True
        pids = {c["name"]: c["pid"] for c in daemon.stats()["clients"]}
        assert pids["max-pid"] == 2**31 - 1
        s.close()
        wait_rounds(probe)
    probe.assert_healthy()


def test_numbers_that_are_not_finite_are_refused(daemon: Daemon) -> None:
    """NaN and infinities have no JSON: refused wherever a client may declare a number."""
    with HealthProbe(daemon.socket) as probe:
        s = raw(daemon.socket)
        for value in (float("nan"), float("inf"), float("-inf")):
            _refused(hello(s, want_arena=False, hash_settings={"seed": value}), "'hash_settings' values")
            _refused(hello(s, want_arena=False, kv_layout={"tp": value}), "finite number")
            group = {"groups": [{"kind": "full", "window": value}]}
            _refused(hello(s, want_arena=False, kv_layout=group), "finite number")
        assert hello(s, want_arena=False, name="finite", hash_settings={"seed": 0.5})["ok"] is True
        for value in (float("nan"), float("inf")):
            s.sendall(frame({"op": "REPORT", "id": 2, "report": {"counters": {"x": value}}}))
            _refused(read_reply(s), "'report.counters' must map names to finite numbers")
            s.sendall(frame({"op": "LOOKUP", "id": 3, "keys": [b"k"], "hold_ms": value}))
            _refused(read_reply(s), "'hold_ms' must be a number")
        _still_served(s)
        stats = daemon.stats()
        s.close()
        wait_rounds(probe)
    probe.assert_healthy()
    json.dumps(stats, allow_nan=False)  # what kvd stat --json prints: no NaN, no Infinity
    assert any(c["hash_settings"] == {"seed": 0.5} for c in stats["clients"])


def test_input_budget_drops_are_one_line_that_says_the_total_was_over(daemon: Daemon) -> None:
    """Many parked connections, then two frames that fill the budget: every parked one goes, and
    the log says so in a line or two (it was one line per connection, each calling its own few
    bytes 'over the budget')."""
    small = P.HEADER.pack(2048) + b"\x00" * 1024  # half a frame of 2 KiB, parked
    big_body = P.MAX_FRAME - 64
    big = P.HEADER.pack(big_body) + b"\x00" * (big_body - 1)  # one byte short
    parked = 40
    with HealthProbe(daemon.socket) as probe:
        smalls = []
        for _ in range(parked):
            s = raw(daemon.socket)
            s.sendall(small)
            smalls.append(s)
        time.sleep(0.3)
        bigs = []
        for _ in range(2):
            s = raw(daemon.socket, timeout=10)
            pipeline(s, big, stall_s=2.0)
            bigs.append(s)
        time.sleep(1.5)  # the loop's tick logs what the last line did not count
        st = daemon.stats()
        for s in smalls + bigs:
            s.close()
        wait_rounds(probe)
    probe.assert_healthy()
    assert st["input_budget_drops_total"] >= parked
    lines = [ln for ln in daemon.log().splitlines() if "input budget" in ln]
    assert 1 <= len(lines) <= 3, lines
    assert not any("is over the daemon" in ln for ln in lines)
    counted = 0
    for ln in lines:
        m = re.search(
            r"WARNING .*input budget: the partial frames of all connections held (\d+) bytes, over the "
            r"daemon's (\d+)-byte input budget; dropped (\d+) connections? whose frames began the "
            r"longest ago, holding (\d+) bytes \(the first: client \d+ \(pid \d+\) held (\d+) bytes\)",
            ln,
        )
        assert m, ln
        held, budget, n, _bytes, first = map(int, m.groups())
        assert held > budget == INPUT_BUDGET_BYTES and first == 4 + 1024  # its header and half its body
        counted += n
    assert counted == st["input_budget_drops_total"]
