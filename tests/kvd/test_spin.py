"""The poll window after traffic (``--busy-poll-us``) is taken only while the host has a CPU to
spare (infera/kvd/spin.py): a daemon whose host is kept busy by other processes sleeps between
requests instead of polling on their CPU time, and keeps serving correct bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from helpers import Daemon
from infera.bench import procfs
from infera.kvd.client import KvdClient
from infera.kvd.spin import SpinGate, runnable_others

PACE_S = 0.002  # a PING every 2 ms: each one opens a 1 ms window that closes before the next
SECONDS = 1.5


def test_runnable_others_reads_the_fourth_field_of_loadavg() -> None:
    assert runnable_others(b"0.40 0.86 1.04 3/345 12345\n") == 2
    assert runnable_others(b"0.00 0.00 0.00 1/80 7") == 0
    assert runnable_others(b"0.00 0.00 0.00 0/80 7") == 0
    assert runnable_others(b"nothing like it") is None
    assert runnable_others(b"1 2 3 x/80 7") is None


def test_a_gate_over_a_file_it_cannot_read_always_polls() -> None:
    gate = SpinGate(path="/nonexistent/loadavg")
    assert gate.may_poll(time.monotonic()) and gate.yielded_total == 0
    gate.close()


def paced_pings(c: KvdClient, pid: int) -> float:
    """The daemon's CPU seconds over SECONDS of one PING every PACE_S."""
    before = procfs.cpu_seconds(pid)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        assert c.ping()
        time.sleep(PACE_S)
    return procfs.cpu_seconds(pid) - before


def test_a_busy_host_closes_the_poll_window_and_the_daemon_keeps_serving(daemon: Daemon) -> None:
    cpus = len(os.sched_getaffinity(0))
    with KvdClient(daemon.socket, namespace="spin") as c:
        quiet = paced_pings(c, daemon.pid)  # nothing else runs: every window is polled
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)
        ]  # fmt: skip
        try:
            time.sleep(0.3)  # the burners are running
            busy = paced_pings(c, daemon.pid)
            data = os.urandom(256 << 10)
            t0 = time.monotonic()
            assert c.put(b"spin-key", data)
            assert c.get(b"spin-key") == data, "correct bytes while the host is busy"
            assert time.monotonic() - t0 < 5
        finally:
            for b in burners:
                b.kill()
                b.wait()
        yielded = c.stats()["busy_poll_yielded_total"]
    assert yielded > 0, "the gate never found the host busy"
    # polling costs about half a core at this pace; sleeping between PINGs, a few per cent
    assert busy < quiet / 3, f"daemon CPU {busy:.3f} s with every CPU busy, {quiet:.3f} s quiet"
