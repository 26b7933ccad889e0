"""The etcd HTTP-gateway client against a real etcd 3.4 on loopback."""

from __future__ import annotations

import time

import pytest
from services import Etcd, free_port

from infera.discovery.etcd import EtcdClient, EtcdError, EtcdUnavailable, parse_endpoints, prefix_end
from infera.errors import UsageError


def test_put_get_prefix_delete(etcd: Etcd) -> None:
    with EtcdClient(etcd.endpoint) as c:
        c.put("/t/a/1", "one")
        c.put("/t/a/2", b"\x00\xfftwo")
        c.put("/t/b", "other")
        got = c.get_prefix("/t/a/")
        assert [(kv.key, kv.value) for kv in got] == [("/t/a/1", b"one"), ("/t/a/2", b"\x00\xfftwo")]
        assert c.get("/t/b") is not None and c.get("/t/b").value == b"other"  # type: ignore[union-attr]
        assert c.get("/t/none") is None
        assert c.delete("/t/a/", prefix=True) == 2
        assert c.get_prefix("/t/") == [c.get("/t/b")]


def test_lease_keeps_a_key_until_it_expires(etcd: Etcd) -> None:
    with EtcdClient(etcd.endpoint) as c:
        lease, ttl = c.grant(2)
        assert ttl == 2 and lease.isdigit() and int(lease) > 2**53, "IDs stay exact as strings"
        c.put("/t/leased", "x", lease=lease)
        assert c.get("/t/leased").lease == lease  # type: ignore[union-attr]
        for _ in range(3):  # kept alive past its TTL
            time.sleep(1)
            assert c.keepalive(lease) == 2
        assert c.get("/t/leased") is not None
        deadline = time.monotonic() + 6
        while c.get("/t/leased") is not None:
            assert time.monotonic() < deadline, "the key outlived its lease"
            time.sleep(0.2)
        assert c.keepalive(lease) == 0
        assert c.time_to_live(lease) == -1


def test_revoke_deletes_the_key_at_once(etcd: Etcd) -> None:
    with EtcdClient(etcd.endpoint) as c:
        lease, _ = c.grant(30)
        c.put("/t/r", "x", lease=lease)
        assert c.revoke(lease) is True
        assert c.get("/t/r") is None
        assert c.revoke(lease) is False


def test_errors_from_etcd_are_etcd_errors(etcd: Etcd) -> None:
    with EtcdClient(etcd.endpoint) as c, pytest.raises(EtcdError) as exc:
        c.put("/t/x", "x", lease="12345")
    assert "lease not found" in exc.value.message
    assert not isinstance(exc.value, EtcdUnavailable)


def test_unreachable_endpoint_falls_through_to_the_next(etcd: Etcd) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with EtcdClient(f"{dead},{etcd.endpoint}", timeout=1) as c:
        c.put("/t/y", "y")
        assert c.endpoint.endswith(etcd.endpoint)
    with EtcdClient(dead, timeout=1) as c, pytest.raises(EtcdUnavailable) as exc:
        c.get("/t/y")
    assert dead in exc.value.message and exc.value.hint


def test_parse_endpoints() -> None:
    assert parse_endpoints("10.0.0.5:2379, etcd.internal") == [
        "http://10.0.0.5:2379",
        "http://etcd.internal:2379",
    ]
    assert parse_endpoints("https://[::1]:2380") == ["https://[::1]:2380"]
    for bad in ("", " , ", "ftp://x:1", "a b:1", "x:port"):
        with pytest.raises(UsageError):
            parse_endpoints(bad)


def test_prefix_end() -> None:
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"
