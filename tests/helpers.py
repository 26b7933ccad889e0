"""Shared test helpers: the daemon harness under its tests' name, a free TCP port, how long a
condition took to come true."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path

from infera.kvd.process import DaemonProcess, wait_until

REPO = Path(__file__).resolve().parent.parent


# The tests' name for the shared harness (infera/kvd/process.py); the conftest fixtures
# ``start_daemon`` and ``daemon`` hand out instances of it.
Daemon = DaemonProcess


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seconds_until(pred: Callable[[], object], timeout: float, what: str, poll_s: float = 0.01) -> float:
    """Seconds until ``pred()`` held (:func:`infera.kvd.process.wait_until`: a KvdError after
    ``timeout``)."""
    started = time.monotonic()
    wait_until(pred, timeout, what, poll_s)
    return time.monotonic() - started
