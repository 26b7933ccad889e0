"""The ``kvd top`` command itself: argument errors, a missing Textual, and a real run in a terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from infera.cli import app


def test_interval_out_of_range_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["top", "--interval", "0"])
    assert result.exit_code == 2
    assert "error: --interval: 0 is out of range" in result.output
    assert "Traceback" not in result.output


def test_missing_textual_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textual", None)  # what `import textual` sees without the extra
    result = CliRunner().invoke(app, ["top", "--socket", "/nonexistent.sock"])
    assert result.exit_code == 1
    assert "error: kvd top needs Textual, which is not installed" in result.output
    assert "pip install 'infera-kvd[tui]'" in result.output
    assert "Traceback" not in result.output


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            if needle in seen:
                return seen
    raise AssertionError(f"{needle!r} never appeared; last output: {seen[-600:]!r}")


def test_kvd_top_in_a_terminal_shows_the_daemon_and_quits_on_q(daemon) -> None:  # type: ignore[no-untyped-def]
    """The installed command in a pseudo-terminal, as a user runs it."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "48"}
    env["INFERA_KVD_SOCKET"] = daemon.socket
    kvd = os.path.join(os.path.dirname(sys.executable), "kvd")
    cmd = [kvd] if os.path.exists(kvd) else [sys.executable, "-c", "from infera.cli import main; main()"]
    proc = subprocess.Popen(
        [*cmd, "top", "--interval", "0.3"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    try:
        out = _read_until(leader, f"pid {daemon.pid}".encode(), timeout=30)
        assert b"Traceback" not in out
        os.write(leader, b"q")
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.1)  # keep draining, or its writes block
            if ready:
                try:
                    os.read(leader, 65536)
                except OSError:
                    break
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


def test_bench_top_render_prints_ratios_against_budget_and_empty_frame() -> None:
    import json

    result = CliRunner().invoke(
        app, ["bench", "top-render", "--clients", "3", "--history", "50", "--frames", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["clients"] == 3 and figures["history_points"] == 50
    assert figures["frame_ms_median"] > 0 and figures["empty_frame_ms_median"] > 0
    assert figures["ratio_to_budget"] == round(figures["frame_ms_median"] / 50.0, 3)
    assert figures["ratio_to_empty"] == round(
        figures["frame_ms_median"] / figures["empty_frame_ms_median"], 2
    )
