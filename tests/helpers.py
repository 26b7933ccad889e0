"""Shared test helpers: the daemon harness under its tests' name, a free TCP port, how long a
condition took to come true."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from infera.bench.services import free_port
from infera.kvd.process import DaemonProcess, wait_until

REPO = Path(__file__).resolve().parent.parent


# The tests' name for the shared harness (infera/kvd/process.py); the conftest fixtures
# ``start_daemon`` and ``daemon`` hand out instances of it.
Daemon = DaemonProcess

__all__ = ["REPO", "Daemon", "free_port", "seconds_until"]


def seconds_until(pred: Callable[[], object], timeout: float, what: str, poll_s: float = 0.01) -> float:
    """Seconds until ``pred()`` held (:func:`infera.kvd.process.wait_until`: a KvdError after
    ``timeout``)."""
    started = time.monotonic()
    wait_until(pred, timeout, what, poll_s)
    return time.monotonic() - started
