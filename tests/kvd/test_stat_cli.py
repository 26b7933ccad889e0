"""``kvd stat`` as a user meets it: bad ``--watch`` values, a watch across a daemon restart, JSON that
is always JSON, ``--all`` in columns, client text escaped, and servers that are not kvd daemons."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hostile import hello, raw
from typer.testing import CliRunner

from helpers import Daemon
from infera.cli import app
from infera.kvd import protocol as P
from infera.kvd.statctl import render_text, to_json

STAT = [sys.executable, "-m", "infera.cli", "stat"]


def _strict_json(text: str) -> Any:
    """``json.loads`` that refuses what Python writes but JSON has not (NaN, Infinity)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# -- --watch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0.0001", "0", "-1", "3601"])
def test_a_watch_out_of_range_is_one_usage_line(value: str) -> None:
    result = CliRunner().invoke(app, ["stat", "--socket", "/nowhere.sock", "--watch", value])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[0].startswith("error: --watch: ")
    assert "out of range" in result.output and "between 0.1 and 3600 seconds" in result.output
    assert "Traceback" not in result.output


def test_the_module_entry_point_says_the_same() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd.statctl", "--watch", "nan", "--socket", "/nowhere.sock"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and out.stderr.startswith("error: --watch: nan is out of range"), out.stderr
    assert "Traceback" not in out.stderr


def test_a_watch_outlives_a_daemon_restart(start_daemon: Callable[..., Daemon], short_tmp: Path) -> None:
    """Unreachable: one line per attempt and the watch goes on; the daemon back: counters again."""
    sock = str(short_tmp / "w.sock")
    proc = subprocess.Popen(
        [*STAT, "--socket", sock, "--watch", "0.2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal sends it: a suite started in the background (`cmd &` in a script)
        # passes SIGINT on ignored, and the watch would never see it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        time.sleep(1.2)  # about six failed attempts
        assert proc.poll() is None, proc.communicate()
        start_daemon("--max-bytes", "16M", name="w")
        time.sleep(1.5)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) >= 3 and all(
        "no kvd daemon" in ln and "trying again every 0.2s" in ln for ln in errors
    )
    assert sum(ln.startswith("hint: ") for ln in err.splitlines()) == 1  # the hint once, not per attempt
    assert "Traceback" not in err
    replies = [_strict_json(ln) for ln in out.splitlines()]
    assert replies and all("sets_total" in r for r in replies)


def test_once_an_unreachable_daemon_is_one_error_and_status_1(short_tmp: Path) -> None:
    result = CliRunner().invoke(app, ["stat", "--socket", str(short_tmp / "none.sock")])
    assert result.exit_code == 1
    assert result.output.startswith("error: no kvd daemon at ")


# -- JSON -----------------------------------------------------------------------------------------
def test_json_is_json_whatever_the_reply_holds() -> None:
    odd = {
        "nan": float("nan"),
        "inf": float("-inf"),
        "blob": b"\x00\xff",
        "nested": {b"k": [float("inf"), b"\x01"], 3: "three", None: 1},
    }
    data = _strict_json(to_json(odd))
    assert data == {
        "nan": None,
        "inf": None,
        "blob": "00ff",
        "nested": {"6b": [None, "01"], "3": "three", "null": 1},
    }


def test_client_floats_that_are_not_numbers_never_reach_stat_json(daemon: Daemon) -> None:
    """NaN and infinities are refused at HELLO and REPORT; what stays is valid JSON."""
    s = raw(daemon.socket)
    try:
        for field in ({"hash_settings": {"x": float("nan")}}, {"kv_layout": {"tp": float("inf")}}):
            reply = hello(s, want_arena=False, **field)
            assert reply["ok"] is False and reply["error"] == "bad_request", reply
        assert hello(s, want_arena=False, hash_settings={"x": 1.5})["ok"] is True
    finally:
        s.close()
    out = subprocess.run(
        [*STAT, "--socket", daemon.socket, "--json"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert isinstance(_strict_json(out.stdout), dict)


# -- text -----------------------------------------------------------------------------------------
def test_all_aligns_to_the_longest_name_and_prints_maps_by_key() -> None:
    stats = {
        "holds_refused_quota_total": 0,
        "evictions_by_class": {"long": 3, "short": 1},
        "namespaces": ["a", "b"],
        "long_backend": None,
    }
    lines = render_text(stats, all_fields=True).splitlines()
    width = len("holds_refused_quota_total") + 2  # the longest name, and two spaces
    assert f"{'holds_refused_quota_total':<{width}}0" in lines
    assert f"{'evictions_by_class.long':<{width}}3" in lines
    assert f'{"namespaces":<{width}}["a", "b"]' in lines
    assert f"{'long_backend':<{width}}null" in lines
    assert f"{'sets_total':<{width}}0" in lines  # the main counters share the column
    assert not any("{" in ln for ln in lines)


def test_control_characters_of_clients_are_escaped(daemon: Daemon) -> None:
    forged = "engine\x1b[2J\x1b[H\nwarning: forged line\r"
    s = raw(daemon.socket)
    try:
        assert hello(s, want_arena=False, name=forged, model="m\x07", role="r\u202eole")["ok"] is True
        out = subprocess.run([*STAT, "--socket", daemon.socket], capture_output=True, text=True, timeout=30)
    finally:
        s.close()
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\r" not in out.stdout and "\u202e" not in out.stdout
    assert "engine\\x1b[2J\\x1b[H\\nwarning: forged line\\r" in out.stdout
    assert not any(ln.startswith("warning: forged") for ln in out.stdout.splitlines())


def test_fields_of_the_wrong_type_are_question_marks() -> None:
    stats = {
        "hits_total": "x",
        "gets_total": [1],
        "arena_bytes_used": "x",
        "arena_bytes_capacity": {"a": 1},
        "clients": [{"pid": "p", "counters": {"load_cost_checks": "x", "load_rate_ram_mbps": "y"}}, 7],
        "tiers": {
            "long": {"backend": "disk", "reconcile": "finished", "reconcile_s": "x", "bytes_used": "y"}
        },
        "warnings": "not a list",
    }
    text = render_text(stats, all_fields=True)
    assert "hits_total              ?" in text and "hit_ratio               ?" in text
    assert "arena                   ? of ? (0 chunks)" in text
    assert "load policy ?: 0 hits judged" in text


# -- servers that are not kvd daemons -------------------------------------------------------------
@contextmanager
def serving(
    path: str, answer: Callable[[dict[str, Any]], bytes | None], raw_reply: bytes = b""
) -> Iterator[None]:
    """A Unix-socket server in a thread: ``raw_reply`` to anything (an HTTP server), else
    ``answer(request)`` for each request frame."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(0.2)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        reader = P.FrameReader(max_frame=1 << 30)
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(1 << 16)
                except OSError:
                    return
                if not data:
                    return
                if raw_reply:
                    conn.sendall(raw_reply)
                    continue
                for body in reader.feed(data):
                    out = answer(P.decode_body(body))
                    if out is not None:
                        conn.sendall(out)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        srv.close()
        os.unlink(path)


def _hello_then(stats_reply: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
    def answer(msg: dict[str, Any]) -> bytes:
        if msg.get("op") == "HELLO":
            return P.encode({"id": msg["id"], "ok": True, "arena_size": 1 << 20, "client_id": 1})
        return P.encode({"id": msg["id"], **stats_reply})

    return answer


def test_an_http_server_is_not_a_kvd_daemon(short_tmp: Path) -> None:
    path = str(short_tmp / "http.sock")
    with serving(path, lambda m: None, raw_reply=b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"):
        result = CliRunner().invoke(app, ["stat", "--socket", path])
    assert result.exit_code == 1, result.output
    first = result.output.splitlines()[0]
    assert first.startswith(f"error: {path} is not a kvd daemon: its reply begins b'HTTP/1.1 400"), first
    assert "bytes exceeds" not in result.output and "Traceback" not in result.output


def test_a_refusal_without_an_error_code_says_so(short_tmp: Path) -> None:
    path = str(short_tmp / "odd.sock")
    with serving(path, _hello_then({"ok": False})):
        result = CliRunner().invoke(app, ["stat", "--socket", path])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: the daemon refused STATS without an error code"), result.output
    assert "error: internal" not in result.output


def test_odd_stats_from_a_server_print_as_question_marks(short_tmp: Path) -> None:
    path = str(short_tmp / "odd.sock")
    odd = {"hits_total": "x", "arena_bytes_used": "x", "blob": b"\x01", "x": float("nan"), "tiers": [1]}
    with serving(path, _hello_then({"ok": True, "stats": odd})):
        text = CliRunner().invoke(app, ["stat", "--socket", path, "--all"])
        js = CliRunner().invoke(app, ["stat", "--socket", path, "--json"])
    assert text.exit_code == 0, text.output
    assert "hits_total" in text.output and "arena                   ? of 0 B" in text.output
    assert js.exit_code == 0, js.output
    assert _strict_json(js.output) == {**odd, "blob": "01", "x": None}
