"""Mooncake's setup() holds the GIL while it runs: a master that is hung, not a master, or a setup
that fails fast must never freeze the daemon (RAM keeps serving, STATS answers at once)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile import HealthProbe
from l4kit import long_stats, wait_long
from services import MooncakeMaster, Service

from helpers import Daemon
from infera.kvd.tiers.mooncakesetup import rdma_devices

pytestmark = pytest.mark.services

MC_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}


def daemon(start: Callable[..., Daemon], name: str, master: str, metadata: str, *extra: str) -> Daemon:
    return start(
        "--max-bytes",
        "32M",
        "--long-backend",
        "mooncake",
        "--mooncake-master",
        master,
        "--mooncake-metadata",
        metadata,
        *extra,
        name=name,
        env=MC_ENV,
    )


def stats_promptly(d: Daemon, rounds: int = 5) -> dict[str, object]:
    """The long tier's stats, asked ``rounds`` times; every answer must come within 0.5 s."""
    s: dict[str, object] = {}
    for _ in range(rounds):
        t0 = time.monotonic()
        s = long_stats(d)
        took = time.monotonic() - t0
        assert took < 0.5, f"STATS took {took:.2f} s"
        time.sleep(0.2)
    return s


def test_hung_master_at_start_never_freezes_ram(
    services: Callable[[Service], Service], service_dir: Path, start_daemon: Callable[..., Daemon]
) -> None:
    master = services(MooncakeMaster(service_dir, client_ttl_s=60))
    assert isinstance(master, MooncakeMaster)
    os.kill(master.pid, signal.SIGSTOP)  # accepts TCP connections, never answers
    try:
        d = daemon(start_daemon, "a", master.address, master.metadata)
        with HealthProbe(d.socket) as probe:
            s = stats_promptly(d, rounds=15)
        probe.assert_healthy()
        assert s["state"] in ("loading", "disconnected"), s
        s = wait_long(d, lambda s: s["setup_failures"] >= 1, timeout=20)
        assert "did not finish" in str(s["last_error"]) and master.address in str(s["last_error"])
    finally:
        os.kill(master.pid, signal.SIGCONT)
    wait_long(d, lambda s: s["state"] == "ready", timeout=60)


def test_failing_setups_are_explained_counted_and_backed_off(
    services: Callable[[Service], Service], service_dir: Path, start_daemon: Callable[..., Daemon]
) -> None:
    master = services(MooncakeMaster(service_dir))
    assert isinstance(master, MooncakeMaster)
    bad_meta = "http://127.0.0.1:1/metadata"
    not_master = f"127.0.0.1:{master.http_port}"  # answers TCP, speaks HTTP
    a = daemon(start_daemon, "a", master.address, bad_meta)
    b = daemon(start_daemon, "b", not_master, master.metadata)
    c = daemon(
        start_daemon,
        "c",
        master.address,
        master.metadata,
        "--mooncake-segment-bytes",
        "100T",
        "--mooncake-protocol",
        "rdma",
    )
    t0 = time.monotonic()
    with HealthProbe(a.socket) as pa, HealthProbe(b.socket) as pb:
        stats_promptly(a, rounds=10)
        stats_promptly(b, rounds=10)
    pa.assert_healthy()
    pb.assert_healthy()

    s = wait_long(a, lambda s: s["setup_failures"] >= 1, timeout=20)
    assert s["state"] == "disconnected" and s["errors"] >= 1
    assert f"--mooncake-metadata {bad_meta}" in s["last_error"], s["last_error"]
    # back-off: tries 1, 2, 4 … s apart (each ~2 s), not one every second
    assert s["setup_failures"] <= 2 + (time.monotonic() - t0) / 3, s["setup_failures"]

    s = wait_long(b, lambda s: s["setup_failures"] >= 1, timeout=30)
    assert not_master in s["last_error"] and s["state"] == "disconnected", s["last_error"]

    s = wait_long(c, lambda s: s["setup_failures"] >= 1, timeout=20)
    assert "-600" in s["last_error"] and "--mooncake-segment-bytes 100" in s["last_error"], s["last_error"]
    if not rdma_devices():
        assert s["protocol"] == "rdma (no RDMA devices: Mooncake uses TCP)"
        assert "no RDMA devices" in c.log()
