"""Shared test helpers: the daemon harness under its tests' name, a free TCP port, how long a
condition took to come true, and a full-screen program (``kvd top``) in a pseudo-terminal."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from infera.bench.services import free_port
from infera.kvd.arena import Arena
from infera.kvd.config import build_config
from infera.kvd.process import DaemonProcess, wait_until
from infera.kvd.store import Store
from infera.kvd.tiers.base import Host
from infera.kvd.tiers.disk import DiskTier

REPO = Path(__file__).resolve().parent.parent


# The tests' name for the shared harness (infera/kvd/process.py); the conftest fixtures
# ``start_daemon`` and ``daemon`` hand out instances of it.
Daemon = DaemonProcess

__all__ = [
    "REPO",
    "Daemon",
    "disk_tier_in_process",
    "free_port",
    "in_pty",
    "pty_quit",
    "pty_read_until",
    "seconds_until",
]


@contextlib.contextmanager
def disk_tier_in_process(tmp_path: Path) -> Iterator[tuple[Store, DiskTier]]:
    """A real 1 MiB store and a real 1 MiB disk tier under ``tmp_path``, in this process and with
    no loop (``call_soon`` does nothing): for driving the tier's methods in a chosen order."""
    cfg = build_config(
        socket=str(tmp_path / "s.sock"),
        max_bytes="1M",
        long_backend="disk",
        long_path=str(tmp_path / "long"),
        long_bytes="1M",
    )
    store, arena = Store(1 << 20), Arena(1 << 20)
    tier = DiskTier(cfg, Host(store, arena, lambda fn: None))
    try:
        yield store, tier
    finally:
        tier.close()
        arena.close()


ROOT = Path(__file__).resolve().parents[1]


def benchmark_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as module ``name`` (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def seconds_until(pred: Callable[[], object], timeout: float, what: str, poll_s: float = 0.01) -> float:
    """Seconds until ``pred()`` held (:func:`infera.kvd.process.wait_until`: a KvdError after
    ``timeout``)."""
    started = time.monotonic()
    wait_until(pred, timeout, what, poll_s)
    return time.monotonic() - started


@contextlib.contextmanager
def in_pty(
    argv: Sequence[str],
    env: dict[str, str],
    new_session: bool = False,
    cwd: str | os.PathLike[str] | None = None,
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr; yields (the terminal's
    other end, the process). A process still running at the end is killed (with ``new_session``
    its whole process group: a shell and what it started)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=follower, stdout=follower, stderr=follower, close_fds=True,
        start_new_session=new_session,
    )  # fmt: skip
    os.close(follower)
    try:
        yield leader, proc
    finally:
        if proc.poll() is None:
            if new_session:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
        os.close(leader)


def pty_read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    """What a program wrote to the pseudo-terminal ``fd`` up to the first ``needle``; fails with the
    end of its output when ``needle`` does not appear within ``timeout`` seconds (or it exits)."""
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


def pty_quit(fd: int, proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float) -> int:
    """Press ``q`` in the pseudo-terminal ``fd`` and keep draining it (or the program's writes block)
    until ``proc`` exits, for at most ``timeout`` seconds; its exit status (waiting 5 s more)."""
    os.write(fd, b"q")
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                break
    return proc.wait(timeout=5)
