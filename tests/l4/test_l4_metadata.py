"""Mooncake metadata modes other than the master's HTTP server, and the other service fixtures."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from l4kit import wait_long
from services import Etcd, MooncakeMaster, MooncakeStorageNode, Redis, Service

from helpers import Daemon

pytestmark = pytest.mark.services


@pytest.mark.parametrize("mode", ["etcd", "p2p"])
def test_sharing_with_etcd_or_p2p_metadata(
    mode: str,
    service_dir: Path,
    services: Callable[[Service], Service],
    start_daemon: Callable[..., Daemon],
) -> None:
    if mode == "etcd":
        etcd = services(Etcd(service_dir))
        assert isinstance(etcd, Etcd)
        metadata = f"etcd://{etcd.endpoint}"
    else:
        metadata = "P2PHANDSHAKE"
    master = services(MooncakeMaster(service_dir))
    assert isinstance(master, MooncakeMaster)
    services(MooncakeStorageNode(service_dir, master, metadata=metadata))
    args = ["--max-bytes", "16M", "--long-backend", "mooncake", "--mooncake-master", master.address]
    env = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "INFERA_KVD_MOONCAKE_METADATA": metadata}
    a = start_daemon(*args, name="a", env=env)
    b = start_daemon(*args, name="b", env=env)
    wait_long(a, lambda s: s["state"] == "ready")
    wait_long(b, lambda s: s["state"] == "ready")
    with a.client(namespace="m") as c:
        c.put(b"meta-key", b"z" * 70_000)
    deadline = time.monotonic() + 15
    with b.client(namespace="m") as c:
        while (got := c.get(b"meta-key")) is None:
            assert time.monotonic() < deadline, b.log()[-2000:]
            time.sleep(0.1)
        assert got == b"z" * 70_000
        with b.client(want_arena=False) as s:
            assert s.stats()["tiers"]["long"]["metadata"] == metadata


def test_etcd_and_redis_fixtures(etcd: Etcd, redis: Redis) -> None:
    with urllib.request.urlopen(f"http://{etcd.endpoint}/version", timeout=2) as r:
        assert b"etcdserver" in r.read()
    with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as s:
        s.sendall(b"SET k v\r\nGET k\r\n")
        want = b"+OK\r\n$1\r\nv\r\n"
        got = b""
        while len(got) < len(want) and (chunk := s.recv(100)):
            got += chunk
        assert got == want
    redis.kill()
    assert not redis.alive()
