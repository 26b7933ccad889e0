"""Random and malformed frames never kill the daemon, and other clients keep being served."""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import Daemon
from infera.kvd.protocol import OPS

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=80),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
requests = st.fixed_dictionaries(
    {"op": st.sampled_from([*OPS, "NOPE", 7]), "id": st.one_of(st.integers(-5, 2**40), st.text(max_size=3))},
    optional={
        "keys": values,
        "lengths": values,
        "tokens": values,
        "leases": values,
        "retention": values,
        "hold_ms": values,
        "versions": values,
        "namespace": values,
        "report": values,
        "noreply": st.booleans(),
        "overwrite": values,
    },
)


def _send_raw(path: str, chunks: list[bytes]) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
        for c in chunks:
            s.sendall(c)
        s.settimeout(0.02)
        with contextlib.suppress(OSError):
            s.recv(65536)
    except OSError:
        pass
    finally:
        s.close()


def _frame(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def _healthy(d: Daemon) -> None:
    assert d.alive(), d.log()
    with d.client(namespace="probe") as c:
        assert c.put(b"probe", b"ok", overwrite=True)
        assert c.get(b"probe") == b"ok"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_random_bytes_never_kill_the_daemon(daemon: Daemon, garbage: list[bytes]) -> None:
    _send_raw(daemon.socket, garbage)
    assert daemon.alive()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(msgs=st.lists(requests, min_size=1, max_size=6), hello_first=st.booleans())
def test_malformed_requests_get_errors_not_crashes(
    daemon: Daemon, msgs: list[dict[str, Any]], hello_first: bool
) -> None:
    frames = [_frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False})] if hello_first else []
    _send_raw(daemon.socket, frames + [_frame(m) for m in msgs])
    assert daemon.alive()


def test_specific_bad_frames_then_service_continues(daemon: Daemon) -> None:
    huge_len = struct.pack(">I", 0xFFFFFFF0) + b"xx"
    cases = [
        [huge_len],
        [_frame([1, 2, 3])],
        [_frame("just a string")],
        [struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1"],  # invalid msgpack
        [_frame({"op": "GET", "id": 1, "keys": [b"a"]})],  # before HELLO
        [_frame({"op": "HELLO", "id": 1, "versions": [99]})],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            _frame({"op": "PUT", "id": 2, "keys": [b"a"], "lengths": [-5]}),
        ],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            _frame({"op": "PUT", "id": 2, "keys": [b"a"], "lengths": [2**62]}),
        ],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            _frame({"op": "SEAL", "id": 2, "tokens": [1, 2, 3]}),
        ],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            _frame({"op": "RELEASE", "id": 2, "leases": [10**9]}),
        ],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            _frame({"op": "REPORT", "id": 2, "report": {"counters": {"a": "b"}}}),
        ],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            _frame({"op": "LOOKUP", "id": 2, "keys": [b"a"] * 70000}),
        ],
        [
            _frame({"op": "HELLO", "id": 1, "versions": [1], "want_arena": False}),
            b"\x00\x00",
        ],  # truncated header, then hang up
    ]
    for chunks in cases:
        _send_raw(daemon.socket, chunks)
        _healthy(daemon)
    with daemon.client() as c:
        st_ = c.stats()
    assert st_["protocol_errors_total"] >= 8
    assert st_["reservations"] == 0  # the PUT of 2**62 bytes never reserved anything


def test_typed_error_reply_shape(daemon: Daemon) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(daemon.socket)
    s.sendall(_frame({"op": "NOPE", "id": 42}))
    header = s.recv(4)
    body = s.recv(struct.unpack(">I", header)[0])
    s.close()
    reply = msgpack.unpackb(body, raw=False)
    assert (
        reply["id"] == 42
        and reply["ok"] is False
        and reply["error"] == "unknown_op"
        and "NOPE" in reply["message"]
    )
