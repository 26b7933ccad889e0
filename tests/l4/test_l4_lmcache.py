"""The lmcache long tier against a real ``lmcache_server``."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import pytest
from l4kit import long_stats, wait_long
from services import LMCacheServer

from helpers import Daemon
from infera.kvd.chunkfile import ns_digest
from infera.kvd.keyspace import lmcache_name
from infera.kvd.tiers.lmcache import HEALTH, OK, PUT, REPLY, request

pytestmark = pytest.mark.services


def lm_daemon(start: Callable[..., Daemon], server: LMCacheServer, name: str) -> Daemon:
    d = start("--max-bytes", "32M", "--long-backend", "lmcache", "--lmcache-url", server.url, name=name)
    wait_long(d, lambda s: s["state"] == "ready")
    return d


def raw_put(server: LMCacheServer, name: str, value: bytes) -> None:
    """Store ``value`` with the server's own protocol, the way any LMCache client would."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(request(PUT, name, len(value)) + value)
        s.sendall(request(HEALTH, name))
        assert REPLY.unpack(s.recv(REPLY.size, socket.MSG_WAITALL))[0] == OK


def test_two_daemons_share_chunks_through_lmcache_server(
    lmcache_server: LMCacheServer, start_daemon: Callable[..., Daemon]
) -> None:
    a = lm_daemon(start_daemon, lmcache_server, "a")
    b = lm_daemon(start_daemon, lmcache_server, "b")
    data = {f"lm-{i}".encode(): os.urandom(200_000 + i) for i in range(4)}
    data[b"\x00\x00lead"] = b"leading zero bytes keep their own name"
    with a.client(namespace="m") as c:
        for k, v in data.items():
            c.put(k, v)
    wait_long(a, lambda s: s["chunks_written"] == len(data) and s["queued_writes"] == 0)
    with b.client(namespace="m") as c:
        assert c.lookup(list(data)) == len(data)
        assert c.get_many(list(data)) == list(data.values())
        assert c.get(b"\x00lead") is None and c.get(b"lead") is None
    with b.client(namespace="n") as c:
        assert c.get(next(iter(data))) is None
    s = long_stats(b)
    assert s["hits"] == len(data) and s["backend"] == "lmcache" and s["deletes_supported"] is False

    # a value that is not a valid chunk (here: another key's chunk under this name) is a miss
    victim = next(iter(data))
    bad = bytearray(os.urandom(5000))
    raw_put(lmcache_server, lmcache_name(ns_digest("m"), b"planted"), bytes(bad))
    with b.client(namespace="m") as c:
        assert c.get(b"planted") is None
        assert c.get(victim) == data[victim]  # already in B's RAM
    assert long_stats(b)["corrupt_chunks"] == 1


def test_lmcache_server_restart(lmcache_server: LMCacheServer, start_daemon: Callable[..., Daemon]) -> None:
    a = lm_daemon(start_daemon, lmcache_server, "a")
    with a.client(namespace="m") as c:
        c.put(b"k", b"v" * 10_000)
    wait_long(a, lambda s: s["chunks_written"] == 1)
    lmcache_server.kill()
    wait_long(a, lambda s: s["state"] == "disconnected", timeout=10)
    with a.client(namespace="m") as c:
        assert c.get(b"k") == b"v" * 10_000  # RAM serves
        t0 = time.monotonic()
        assert c.get(b"absent") is None
        assert time.monotonic() - t0 < 0.5
    lmcache_server.start()  # empty again: it keeps nothing across restarts
    s = wait_long(a, lambda s: s["reconnects"] == 1 and s["chunks_written"] >= 2, timeout=30)
    assert s["disconnects"] == 1
    b = lm_daemon(start_daemon, lmcache_server, "b")
    with b.client(namespace="m") as c:
        assert c.get(b"k") == b"v" * 10_000  # A wrote its RAM copy again after the restart


def test_lookup_pipelines_existence_checks_past_one_slice(
    lmcache_server: LMCacheServer, start_daemon: Callable[..., Daemon]
) -> None:
    a = lm_daemon(start_daemon, lmcache_server, "a")
    b = lm_daemon(start_daemon, lmcache_server, "b")
    data = {f"many-{i}".encode(): os.urandom(2048) for i in range(140)}  # > one slice of 128
    with a.client(namespace="m") as c:
        c.put_many(list(data.items()))
    wait_long(a, lambda s: s["chunks_written"] == len(data) and s["queued_writes"] == 0)
    keys = list(data)
    with b.client(namespace="m") as c:
        before = long_stats(b)
        assert c.lookup(keys) == 140
        mid = long_stats(b)
        assert mid["exists_calls"] - before["exists_calls"] == 1
        assert mid["exists_keys"] - before["exists_keys"] == 140
        assert c.lookup([*keys[:135], b"gap", *keys[135:]]) == 135
        # the connection stays in step after pipelining: a read on it still returns the right value
        assert c.get(keys[139]) == data[keys[139]]
    assert long_stats(b)["errors"] == 0
