from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from infera.kvd.process import DaemonProcess


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: Unix socket paths must stay under ~100 bytes."""
    d = Path(tempfile.mkdtemp(prefix="kvd-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def start_daemon(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Factory: ``start_daemon("--max-bytes", "64M", name="a")`` starts a real daemon process."""
    started: list[DaemonProcess] = []

    def _start(*args: str, name: str = "kvd", env: dict[str, str] | None = None) -> DaemonProcess:
        sock = str(short_tmp / f"{name}.sock")
        d = DaemonProcess(sock, list(args) or ["--max-bytes", "64M"], short_tmp / f"{name}.log", env=env)
        started.append(d)
        return d.start()

    yield _start
    for d in started:
        d.stop()


@pytest.fixture
def daemon(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """One real daemon with a 64 MiB arena on a temporary socket."""
    return start_daemon("--max-bytes", "64M")
