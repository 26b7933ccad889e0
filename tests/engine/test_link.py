"""DaemonLink against a real daemon: degrade while it is gone, come back when it is back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import Daemon
from infera.engine.vllm.keys import EngineFacts, make_namespace
from infera.engine.vllm.link import DaemonLink
from infera.kvd.client import KvdUnavailable

NS = make_namespace(
    EngineFacts(
        model="/m/tiny", model_type="llama", num_layers=2, total_kv_heads=2, kv_heads_per_rank=2, head_size=32,
        use_mla=False, dtype="bfloat16", kv_cache_dtype="auto", block_size=128, hash_block_size=128,
        bytes_per_token=512, tp_size=1, pp_size=1, hash_algo="sha256", hash_seed="fixed", vllm_version="0.32",
        platform="cpu",
    ),
    256,
)  # fmt: skip


def make_link(sock: str, **kw: object) -> DaemonLink:
    return DaemonLink(
        sock,
        NS,
        role="vllm-worker-0",
        name="test",
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
    d = start_daemon("--max-bytes", "16M")
    link = make_link(d.socket)
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
    link = make_link(d.socket)
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
