"""Shared test helpers: the daemon harness under its tests' name, a free TCP port."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from infera.kvd.process import DaemonProcess

REPO = Path(__file__).resolve().parent.parent


# The tests' name for the shared harness (infera/kvd/process.py); the conftest fixtures
# ``start_daemon`` and ``daemon`` hand out instances of it.
Daemon = DaemonProcess


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
