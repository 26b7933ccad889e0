"""Flags of the distributed long tier: validation, env var fallbacks, one-line errors."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from services import free_port

from helpers import Daemon
from infera.errors import UsageError
from infera.kvd.config import build_config
from infera.kvd.flags import parse_master
from infera.kvd.keyspace import lmcache_name, mooncake_name
from infera.kvd.tiers.lmcache import MAX_KEY

BASE: dict[str, Any] = {
    "socket": "/tmp/x.sock",
    "max_bytes": "64M",
    "long_path": None,
    "long_bytes": None,
    "socket_mode": "0660",
    "allow_uid": [],
    "log_level": "info",
    "metrics_port": None,
    "ephemeral_ttl": "300s",
}


def cfg(**kw: Any):  # type: ignore[no-untyped-def]
    return build_config(**{**BASE, "long_backend": None, **kw})


def test_mooncake_flags_are_validated() -> None:
    c = cfg(long_backend="mooncake", mooncake_master="10.0.0.5:50051", mooncake_segment_bytes="1G")
    assert c.mooncake_master == "10.0.0.5:50051"
    assert c.mooncake_metadata == "P2PHANDSHAKE" and c.mooncake_protocol == "tcp"
    assert c.mooncake_segment_bytes == 1 << 30 and c.mooncake_buffer_bytes == 16 << 20
    c = cfg(
        long_backend="mooncake",
        mooncake_master="etcd://10.0.0.1:2379",
        mooncake_metadata="http://10.0.0.5:8080/metadata",
        mooncake_protocol="RDMA",
        mooncake_device="mlx5_0",
        mooncake_buffer_bytes="64M",
    )
    assert c.mooncake_protocol == "rdma" and c.mooncake_device == "mlx5_0"
    assert c.mooncake_buffer_bytes == 64 << 20
    bad = [
        ({}, "needs --mooncake-master"),
        ({"mooncake_master": "nohost"}, "is not HOST:PORT"),
        ({"mooncake_master": "h:99999"}, "is not HOST:PORT"),
        ({"mooncake_master": "http://127.0.0.1:15051"}, "is not HOST:PORT or etcd://HOST:PORT"),
        ({"mooncake_master": "foo://127.0.0.1:15051"}, "is not HOST:PORT or etcd://HOST:PORT"),
        ({"mooncake_master": "h:1", "mooncake_metadata": "ftp://x"}, "metadata service URL"),
        ({"mooncake_master": "h:1", "mooncake_protocol": "udp"}, "is not tcp or rdma"),
        ({"mooncake_master": "h:1", "mooncake_segment_bytes": "lots"}, "--mooncake-segment-bytes"),
    ]
    for kw, msg in bad:
        with pytest.raises(UsageError, match=msg):
            cfg(long_backend="mooncake", **kw)


def test_lmcache_url_is_validated() -> None:
    assert (
        cfg(long_backend="lmcache", lmcache_url="lm://127.0.0.1:65432").lmcache_url == "lm://127.0.0.1:65432"
    )
    for url, msg in (
        (None, "needs --lmcache-url"),
        ("http://h:1", "is not lm://"),
        ("lm://h", "is not lm://"),
    ):
        with pytest.raises(UsageError, match=msg):
            cfg(long_backend="lmcache", lmcache_url=url)


def test_disk_and_distributed_are_never_combined() -> None:
    with pytest.raises(UsageError, match="never both"):
        cfg(long_backend="mooncake", long_path="/tmp/x", mooncake_master="h:1")
    with pytest.raises(UsageError, match="never both"):
        cfg(long_backend="lmcache", long_path="/tmp/x", lmcache_url="lm://h:1")


def test_names_are_stable_and_fit_the_servers() -> None:
    digest = bytes(range(32))
    assert mooncake_name(digest, b"\x01\x02") == "kvd1/0001020304050607/0102"
    assert parse_master("etcd://10.0.0.1:2379,10.0.0.2:2379") == ("10.0.0.1", 2379)
    longest = lmcache_name(digest, b"\xff" * 64)
    assert len(longest) <= MAX_KEY and longest.split("@")[1:3] == ["1", "0"]
    # leading zero bytes must not collide: the server compares the hash as an integer
    a, b = lmcache_name(digest, b"\x00\x01"), lmcache_name(digest, b"\x01")
    assert int(a.split("@")[3], 16) != int(b.split("@")[3], 16)


def test_flags_come_from_env_and_errors_are_one_line(start_daemon: Callable[..., Daemon]) -> None:
    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("the mooncake extra is not installed")
    port = free_port()  # nothing listens there: the daemon must start anyway
    env = {"INFERA_KVD_MOONCAKE_MASTER": f"127.0.0.1:{port}", "INFERA_KVD_MOONCAKE_PROTOCOL": "tcp"}
    t0 = time.monotonic()
    d = start_daemon("--max-bytes", "16M", "--long-backend", "mooncake", name="env", env=env)
    assert time.monotonic() - t0 < 10
    with d.client(want_arena=False) as c:
        long = c.stats()["tiers"]["long"]
    assert long["endpoint"] == f"127.0.0.1:{port}" and long["state"] in ("loading", "disconnected")
    res = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--socket", "/tmp/never.sock", "--long-backend", "mooncake"],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("INFERA_KVD_MOONCAKE")},
    )
    assert res.returncode != 0
    assert "needs --mooncake-master" in res.stderr + res.stdout and "Traceback" not in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--socket", "/tmp/never.sock", "--long-backend", "mooncake"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "INFERA_KVD_MOONCAKE_MASTER": "http://127.0.0.1:15051"},
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "is not HOST:PORT or etcd://HOST:PORT" in res.stderr
