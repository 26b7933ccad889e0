"""Mooncake's ``setup()`` outside the daemon: a probe in a child process, and what a failure means.

``MooncakeDistributedStore.setup()`` holds Python's GIL for as long as it runs: against a master
that accepts TCP but never answers (stopped, or not a Mooncake master) it retries for about ten
minutes, and a setup that fails fast (bad metadata URL, ``etcd://`` with no master) still takes
about 2 s. Called in the daemon, either freezes every thread, RAM included. So the monitor first
runs the same setup in a short-lived child process with a deadline, mounting no segment (one it
mounted could take another client's writes for a moment and lose them when it closes), and calls
``setup()`` in the daemon only after the probe worked. A segment larger than the host's memory is refused without any call (Mooncake
answers ``-600`` after failing to allocate it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass

from infera.kvd.tiers.transport import TransportError
from infera.units import format_size

# Mooncake Store error codes (mooncake-store/include/types.h) the tier reacts to.
ERRORS = {
    -1: ("internal error", "error"),
    -10: ("buffer overflow", "error"),
    -101: ("segment not found", "error"),
    -200: ("no available handle: no mounted segment has room (full, or no storage node mounted)", "full"),
    -400: ("invalid key", "error"),
    -600: ("invalid parameters", "error"),
    -703: ("replica not ready", "missing"),
    -704: ("object not found", "missing"),
    -705: ("object already exists", "error"),
    -706: ("object has a lease", "error"),
    -707: ("lease expired before the transfer finished (the data may have been evicted)", "error"),
    -710: ("replica not found", "missing"),
    -712: ("replica is gone", "missing"),
    -714: ("replica busy", "error"),
    -800: ("transfer failed", "error"),
    -900: ("RPC to the master failed", "down"),
    -901: ("RPC to the master timed out", "down"),
    -1010: ("the master cannot serve this now (not the leader, or starting)", "error"),
}

PROBE_DEADLINE_S = 10.0
PROBE_SEGMENT_BYTES = 0  # the probe mounts nothing: the master must never place a write in it
NO_RDMA = "no RDMA devices: Mooncake uses TCP"

_CHILD = """
import os, signal, sys
signal.alarm(int(sys.argv[1]))  # dies by itself if the daemon is gone
from mooncake.store import MooncakeDistributedStore
a = sys.argv[2:]
s = MooncakeDistributedStore()
rc = s.setup(a[0], a[1], int(a[2]), int(a[3]), a[4], a[5], a[6])
print("rc", rc, flush=True)
if rc == 0:
    s.close()
os._exit(0)
"""


@dataclass(frozen=True)
class Settings:
    """What ``setup()`` is called with (the flags of docs/l4.md)."""

    local: str
    metadata: str
    segment_bytes: int
    buffer_bytes: int
    protocol: str
    device: str
    master: str

    def setup_args(self, segment_bytes: int | None = None) -> tuple[str, str, int, int, str, str, str]:
        """``setup()``'s arguments, in its order (``segment_bytes`` in place of the setting's)."""
        s = self
        seg = s.segment_bytes if segment_bytes is None else segment_bytes
        return (s.local, s.metadata, seg, s.buffer_bytes, s.protocol, s.device, s.master)

    def args(self, segment_bytes: int) -> list[str]:
        """The same, as the probe child's command line."""
        return [str(a) for a in self.setup_args(segment_bytes)]

    @property
    def named(self) -> str:
        return f"--mooncake-master {self.master}, --mooncake-metadata {self.metadata}"


def rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def explain(rc: int, s: Settings) -> str:
    """One line on a failed ``setup()``: the code, what it is known to mean, the settings involved."""
    if rc == -600:
        return (
            f"Mooncake setup refused its parameters (-600): usually --mooncake-segment-bytes "
            f"{format_size(s.segment_bytes)} could not be allocated, or --mooncake-protocol {s.protocol} / "
            f"--mooncake-device {s.device or '(none)'} do not fit this host"
        )
    if rc == -1 and s.master.startswith("etcd://"):
        return (
            f"Mooncake setup failed (-1): no master is registered in etcd at --mooncake-master {s.master} "
            "(is the master running with --enable_ha, and MC_STORE_CLUSTER_ID its --cluster_id?)"
        )
    if rc == -1:
        return (
            f"Mooncake setup failed (-1): its client could not start; check that --mooncake-metadata "
            f"{s.metadata} answers and that --mooncake-master {s.master} is a mooncake_master's RPC port"
        )
    text = ERRORS.get(rc, (f"error {rc}", ""))[0]
    return f"Mooncake setup failed: {text} ({rc}) ({s.named})"


def _glog_error(stderr: str) -> str:
    """The first error line Mooncake logged (``E1207 04:19:29.2 123 file.cpp:9] text``), its text."""
    for line in stderr.splitlines():
        if line[:1] == "E" and "] " in line:
            return line.split("] ", 1)[1].strip()[:200]
    return ""


class SetupProbe:
    """Runs the child process; :meth:`interrupt` (any thread) ends a running one at once."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def check(self, s: Settings, deadline_s: float = PROBE_DEADLINE_S) -> None:
        """Raise TransportError (kind ``down``) unless ``setup()`` with these settings works."""
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if s.segment_bytes > memory:
            raise TransportError(
                f"Mooncake setup would fail (-600): --mooncake-segment-bytes {format_size(s.segment_bytes)} "
                f"is more than this host's {format_size(memory)} of memory",
                "down",
            )
        argv = [sys.executable, "-c", _CHILD, str(int(deadline_s) + 5)]
        with self._lock:
            if self._stopped:
                raise TransportError("stopping", "down")
            self._child = child = subprocess.Popen(
                [*argv, *s.args(min(s.segment_bytes, PROBE_SEGMENT_BYTES))],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        try:
            out, err = child.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise TransportError(
                f"Mooncake setup did not finish within {deadline_s:.0f} s: {s.named} accepts connections "
                "but does not answer (a hung master, or not a mooncake_master's RPC port)",
                "down",
            ) from None
        finally:
            with self._lock:
                self._child = None
        words = out.split()
        if len(words) != 2 or words[0] != "rc":
            said = _glog_error(err) or err.strip()[-200:] or f"exit status {child.returncode}"
            raise TransportError(f"Mooncake setup probe failed ({s.named}): {said}", "down")
        rc = int(words[1])
        if rc != 0:
            said = _glog_error(err)
            raise TransportError(explain(rc, s) + (f"; Mooncake says: {said}" if said else ""), "down")

    def interrupt(self) -> None:
        with self._lock:
            self._stopped = True
            child = self._child
        if child is not None and child.poll() is None:
            child.kill()


__all__ = ["NO_RDMA", "PROBE_DEADLINE_S", "Settings", "SetupProbe", "explain", "rdma_devices"]
