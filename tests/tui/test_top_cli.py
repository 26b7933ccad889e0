"""The ``kvd top`` command itself: argument errors, a missing Textual, and a real run in a terminal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from helpers import in_pty, pty_quit, pty_read_until
from infera.cli import app


def test_interval_out_of_range_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["top", "--interval", "0"])
    assert result.exit_code == 2
    assert "error: --interval: 0 is out of range" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("value", ["nan", "inf", "0.05", "3601"])
def test_interval_shares_the_range_of_stat_watch(value: str) -> None:
    result = CliRunner().invoke(app, ["top", "--interval", value])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: --interval: {float(value):g} is out of range")
    assert "between 0.1 and 3600 seconds" in result.output


def test_stdout_that_is_not_a_terminal_is_refused(daemon) -> None:  # type: ignore[no-untyped-def]
    """``kvd top > file`` wrote escapes into the file and ran until killed."""
    out = subprocess.run(
        [sys.executable, "-c", "from infera.cli import main; main()", "top", "--socket", daemon.socket],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stdout == b""
    assert (
        out.stderr.decode() == "error: kvd top needs a terminal; kvd stat --json prints the same counters\n"
    )


def test_missing_textual_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textual", None)  # what `import textual` sees without the extra
    result = CliRunner().invoke(app, ["top", "--socket", "/nonexistent.sock"])
    assert result.exit_code == 1
    assert "error: kvd top needs Textual, which is not installed" in result.output
    assert "pip install 'infera-kvd[tui]'" in result.output
    assert "Traceback" not in result.output


def test_kvd_top_in_a_terminal_shows_the_daemon_and_quits_on_q(daemon) -> None:  # type: ignore[no-untyped-def]
    """The installed command in a pseudo-terminal, as a user runs it."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "48"}
    env["INFERA_KVD_SOCKET"] = daemon.socket
    kvd = os.path.join(os.path.dirname(sys.executable), "kvd")
    cmd = [kvd] if os.path.exists(kvd) else [sys.executable, "-c", "from infera.cli import main; main()"]
    with in_pty([*cmd, "top", "--interval", "0.3"], env) as (leader, proc):
        out = pty_read_until(leader, f"pid {daemon.pid}".encode(), timeout=30)
        assert b"Traceback" not in out
        assert pty_quit(leader, proc, timeout=15) == 0


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
