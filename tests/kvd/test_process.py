"""The daemon harness itself (infera/kvd/process.py): start, early exit, restart, stop."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from infera.errors import KvdError
from infera.kvd.process import DaemonProcess, temp_daemon


def test_starts_serves_and_stop_is_idempotent(short_tmp: Path) -> None:
    d = DaemonProcess(str(short_tmp / "p.sock"), ["--max-bytes", "8M"], short_tmp / "p.log")
    assert d.stop() is None and not d.alive()  # never started: nothing to stop
    assert d.start() is d and d.alive()
    with d.client(want_arena=False) as c:
        assert c.ping()
    assert d.argv[1:5] == ["-m", "infera.kvd", "--socket", d.socket]
    assert d.stop() == 0 and not d.alive()
    assert d.stop() == 0  # again: the same status, no signal to a reaped pid
    d.kill()  # a no-op on a stopped daemon
    assert "shutting down" in d.log() and not os.path.exists(d.socket)


def test_early_exit_is_an_error_with_the_log_tail(short_tmp: Path) -> None:
    d = DaemonProcess(str(short_tmp / "bad.sock"), ["--max-bytes", "12X"], short_tmp / "bad.log")
    t = time.monotonic()
    with pytest.raises(KvdError) as exc:
        d.start(timeout=60)
    assert time.monotonic() - t < 30  # the exit is noticed, the timeout is not waited out
    msg = str(exc.value)
    assert "exited with status 2 before serving" in msg and str(d.log_path) in msg
    assert "--max-bytes: '12X' is not a size" in msg  # the daemon's own error, from its log
    assert not d.alive()


def test_no_answer_in_time_is_an_error_and_the_process_is_killed(short_tmp: Path) -> None:
    nap = "import os, time; print('napping', os.environ['NAP'], flush=True); time.sleep(60)"
    d = DaemonProcess(
        str(short_tmp / "slow.sock"),
        [],
        short_tmp / "slow.log",
        command=[sys.executable, "-c", nap],
        env={"NAP": "z"},
    )
    with pytest.raises(KvdError, match="did not answer PING") as exc:
        d.start(timeout=0.5)
    assert "napping z" in str(exc.value) and not d.alive()


def test_restart_keeps_the_socket_and_the_log(short_tmp: Path) -> None:
    sock = str(short_tmp / "r.sock")
    long = short_tmp / "long"
    args = ["--max-bytes", "8M", "--long-path", str(long), "--long-bytes", "16M"]
    with DaemonProcess(sock, args, short_tmp / "r.log") as d:
        first = d.pid
        d.restart()
        assert d.alive() and d.pid != first and d.socket == sock
        with d.client() as c:
            assert c.ping()
        assert d.log().count("serving on") == 2  # both starts appended to one log
    assert not d.alive() and not os.path.exists(sock)
    assert short_tmp.exists()  # a socket given by the caller: its directory is the caller's


def test_temporary_socket_is_removed_with_the_daemon() -> None:
    with temp_daemon("--max-bytes", "8M") as (sock, d):
        assert d.socket == sock and d.alive()
        tmp = Path(sock).parent
        assert tmp.name.startswith("kvd-bench-") and d.log_path.parent == tmp
        with d.client(want_arena=False) as c:
            assert c.ping()
    assert not d.alive() and not tmp.exists()
    with pytest.raises(KvdError, match="is not a size"), temp_daemon("--max-bytes", "12X") as _:
        pass
