"""DaemonLink against a real daemon: degrade while it is gone, come back when it is back."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_keys import facts

from helpers import Daemon, seconds_until
from infera.engine.vllm.keys import chunk_key, make_namespace
from infera.engine.vllm.link import DaemonLink
from infera.kvd.client import KvdUnavailable
from infera.kvd.process import wait_until

NS = make_namespace(facts(model="/m/tiny"), 256)  # the tiny Llama of test_keys


def make_link(sock: str, **kw: object) -> DaemonLink:
    kw = {"name": "test", **kw}
    return DaemonLink(
        sock,
        NS,
        role="vllm-worker-0",
        model="/m/tiny",
        want_arena=True,
        retry_initial_s=0.05,
        **kw,
    )  # type: ignore[arg-type]


def test_link_declares_namespace_and_hash_settings(daemon: Daemon) -> None:
    link = make_link(daemon.socket)
    client = link.client()
    assert client is not None and client.arena_size > 0
    with daemon.client(want_arena=False) as tool:
        mine = [c for c in tool.stats()["clients"] if c["role"] == "vllm-worker-0"]
    assert mine and mine[0]["namespace"] == NS.name
    assert mine[0]["hash_fingerprint"] == NS.hash_fingerprint
    assert mine[0]["hash_settings"] == NS.hash_settings
    assert mine[0]["chunk_tokens"] == 256
    link.close()


def test_link_degrades_logs_once_and_reconnects(
    start_daemon: Callable[..., Daemon], short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the watcher thread (watch=False) a lost connection is noticed by the next call."""
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket, watch=False)
    assert link.client() is not None
    d.stop()
    with caplog.at_level(logging.INFO, logger="infera.engine.vllm"):
        client = link.client()
        assert client is not None  # the link does not know yet
        with pytest.raises(KvdUnavailable):
            client.ping()
        link.failed(KvdUnavailable("lost"))
        for _ in range(5):
            assert link.client() is None
            time.sleep(0.06)
        d.start()
        deadline = time.monotonic() + 5
        while link.client() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert link.client() is not None
    assert link.client().ping()  # type: ignore[union-attr]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1
    assert any("reconnected" in m for m in messages)
    assert link.counters["outages"] == 1
    assert link.counters["connect_failures"] >= 1
    link.close()


def test_link_to_missing_daemon_returns_none(short_tmp: Path) -> None:
    link = make_link(str(short_tmp / "nobody.sock"))
    assert link.client() is None
    assert link.client() is None  # within backoff: no second attempt
    assert link.counters["connect_failures"] == 1


def test_restarted_daemon_costs_no_failed_call(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket, watch=False)  # the call itself finds the connection dead
    assert link.call(lambda c: c.ping())
    d.restart()
    assert link.call(lambda c: c.ping())  # the dead connection is replaced inside the call
    assert link.counters["disconnects"] == 1
    assert link.counters["outages"] == 0
    link.close()


def test_call_without_daemon_raises_unavailable(short_tmp: Path) -> None:
    link = make_link(str(short_tmp / "nobody.sock"))
    with pytest.raises(KvdUnavailable):
        link.call(lambda c: c.ping())


KEY = chunk_key(NS.digest, b"\x01" * 32, 0)


def test_link_reconnects_in_the_background_after_a_daemon_restart(
    start_daemon: Callable[..., Daemon], caplog: pytest.LogCaptureFixture
) -> None:
    """A crashed and restarted daemon: the link notices and reconnects by itself (no request in
    between), so the first request after the restart finds a connection."""
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket)
    assert link.client() is not None
    with caplog.at_level(logging.INFO, logger="infera.engine.vllm"):
        d.kill()
        wait_until(lambda: not link.connected, 1.0, "the hang-up to be seen without a request", 0.01)
        time.sleep(0.6)  # an outage of a few retries
        d.start()
        took = seconds_until(lambda: link.connected, 1.0, "the link to reconnect")
    assert took < 1.0
    assert link.counters["connects"] == 2, "the watcher reconnected, not a call"
    assert link.call(lambda c: c.lookup([KEY])) == 0
    assert (link.counters["disconnects"], link.counters["outages"]) == (1, 1)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("retrying every 0.25 s in the background" in m for m in messages) == 1
    assert sum("reconnected" in m for m in messages) == 1
    link.close()


def test_daemon_lists_the_engine_again_after_a_restart_without_a_request(
    start_daemon: Callable[..., Daemon],
) -> None:
    """kvd stat shows the engine again within a second or two of a restart: the background
    reconnect sends the same HELLO (name, role, model, namespace) at once."""
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket, name="engine-19")
    assert link.client() is not None
    d.restart()

    def listed() -> list[dict[str, object]]:
        with d.client(want_arena=False) as tool:
            return [c for c in tool.stats()["clients"] if c.get("name") == "engine-19"]

    wait_until(lambda: bool(listed()), 2.0, "the link to be listed", 0.01)
    (mine,) = listed()
    assert (mine["role"], mine["model"], mine["namespace"]) == ("vllm-worker-0", "/m/tiny", NS.name)
    assert mine["hash_fingerprint"] == NS.hash_fingerprint
    link.close()


def test_watcher_sleeps_while_connected_and_retries_on_a_timer(start_daemon: Callable[..., Daemon]) -> None:
    """No busy loop: no wake-ups at all while connected; about four connect attempts a second
    while the daemon is gone, requests meanwhile answered at once (recompute); close() ends it."""
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket)
    assert link.client() is not None
    watcher = link._watcher
    assert watcher is not None and watcher.daemon and watcher.is_alive()
    time.sleep(0.1)
    woke = link.wakeups
    time.sleep(1.0)
    assert link.wakeups == woke, "asleep while connected"
    d.stop()
    wait_until(lambda: not link.connected, 1.0, "the link to see the hang-up", 0.01)
    woke, failures = link.wakeups, link.counters["connect_failures"]
    started = time.monotonic()
    assert link.client() is None
    with pytest.raises(KvdUnavailable):
        link.call(lambda c: c.ping())
    assert time.monotonic() - started < 0.2, "a request never waits for the daemon"
    time.sleep(1.0)
    assert 2 <= link.wakeups - woke <= 8
    assert 2 <= link.counters["connect_failures"] - failures <= 8
    link.close()
    watcher.join(2)
    assert not watcher.is_alive()
    d.start()
    time.sleep(0.4)
    assert not link.connected and link.client() is None, "a closed link stays closed"


def test_a_dropped_link_ends_its_watcher(short_tmp: Path) -> None:
    link = make_link(str(short_tmp / "nobody.sock"))
    assert link.client() is None
    watcher = link._watcher
    assert watcher is not None and watcher.is_alive()
    del link
    gc.collect()
    watcher.join(2)
    assert not watcher.is_alive()


def test_a_request_right_after_a_restart_connects_before_the_watchers_next_try(
    start_daemon: Callable[..., Daemon],
) -> None:
    """The daemon bound its socket anew since the last failed try: the request tries at once
    (one stat per request while the daemon is gone), instead of missing until the next tick."""
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket, retry_every_s=30.0)  # the watcher's next try is far away
    assert link.client() is not None
    d.kill()
    wait_until(lambda: link.counters["connect_failures"] == 1, 1.0, "its immediate retry to fail", 0.01)
    assert link.client() is None, "a stale socket file is not tried again before the tick"
    assert link.counters["connect_failures"] == 1
    d.start()
    assert link.call(lambda c: c.lookup([KEY])) == 0
    assert link.counters["connects"] == 2
    link.close()
