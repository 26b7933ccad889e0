"""The trust boundary: what a client, another local user or a fake daemon can do to the daemon
and its clients (a sealed arena, a vetted socket path, a verified listener, a full accept queue).

Tests that need a second local user run as root and use uid/gid 65534 (``nobody``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import FakeDaemon, HealthProbe, hello_fds, raw

from helpers import Daemon
from infera.kvd.client import (
    KvdArenaError,
    KvdClient,
    KvdProtocolError,
)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second local user")
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 16)
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def enough_rounds(probe: HealthProbe, rounds: int = 40) -> None:
    wait_for(lambda: len(probe.latencies) >= rounds or probe.errors, 30, f"{rounds} healthy rounds")


# -- item 1: nobody can resize the arena -----------------------------------------------------
def test_a_client_cannot_resize_the_arena_and_the_disk_tier_keeps_working(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    d = start_daemon("--max-bytes", "16M", "--long-path", str(short_tmp / "long"), "--long-bytes", "64M")
    with HealthProbe(d.socket) as probe, d.client(namespace="writer") as writer:
        hostile = raw(d.socket)
        reply, fds = hello_fds(hostile)
        assert reply["ok"] and len(fds) == 1
        fd, size = fds[0], reply["arena_size"]
        try:
            # checked first so that today's unsealed arena fails here, before any damage
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SIZE_SEALS == SIZE_SEALS
            for new_size in (0, size // 2, size - 4096, size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, new_size)
            with pytest.raises(PermissionError):  # F_SEAL_SEAL: no seal can be added either
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
            with pytest.raises(OSError):
                os.posix_fallocate(fd, 0, size + (1 << 20))
            assert os.fstat(fd).st_size == size
            # the hostile client's own mapping still works to the last byte
            with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                assert m[size - 1 : size] is not None
        finally:
            for f in fds:
                os.close(f)
            hostile.close()
        # the daemon reads the arena for write-through: it must still do so, bytes intact
        data = {b"long-%d" % i: os.urandom(256 << 10) for i in range(8)}
        for key, value in data.items():
            assert writer.put(key, value, retention="long")
        wait_for(
            lambda: (s := writer.stats()["tiers"]["long"])["queued_writes"] == 0 and s["chunks"] >= 8,
            what="8 chunks written through",
        )
        assert {k: writer.get(k) for k in data} == data
        assert d.alive()
        enough_rounds(probe)
    probe.assert_healthy()


def test_the_client_refuses_an_unsealed_arena(short_tmp: Path) -> None:
    path = str(short_tmp / "fake.sock")
    with FakeDaemon(path, arena="unsealed") as fake:
        with pytest.raises(KvdArenaError, match="not sealed"):
            KvdClient(path, timeout=5)
        assert "PUT" not in fake.ops


def test_a_short_arena_is_the_clients_own_error(short_tmp: Path) -> None:
    path = str(short_tmp / "fake.sock")
    with FakeDaemon(path, arena="short"):
        with pytest.raises(KvdArenaError, match="fewer than the 1048576 announced"):
            KvdClient(path, timeout=5)
        with KvdClient(path, timeout=5, want_arena=False) as c:  # no arena: nothing to check
            assert c.ping()
    with FakeDaemon(path, arena="none"), pytest.raises(KvdProtocolError, match="did not pass the arena"):
        KvdClient(path, timeout=5)
