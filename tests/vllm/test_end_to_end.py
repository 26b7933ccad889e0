"""Two real vLLM engines (fresh processes) sharing one kvd daemon through InferaKvdConnector.

Engine A starts before its daemon (it must serve by recompute and reconnect), then computes a
~1,000-token prompt and two prompts with ``none`` and ``short`` retention, in 384-token steps so
that chunks complete across steps. Engine B, a fresh
process, must get external prefix-cache hits with the same greedy tokens, and different tokens
once the stored chunks are overwritten with noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import EngineRun, prompt, run_engine

from helpers import Daemon

P1 = prompt(1, 1000)  # ~1,000 tokens: 3 whole 256-token chunks (the last token is never loaded)
P2 = prompt(2, 600)  # retention none
P3 = prompt(3, 600)  # retention short
P4 = prompt(4, 1024)  # exactly 4 chunks: the last one is loaded but for its final block
CHUNK = 256  # INFERA_KVD_CHUNK_TOKENS=auto for the tiny model: 512 B/token, capped at 256 tokens


@pytest.fixture(scope="module")
def kvd(module_tmp: Path) -> Iterator[Daemon]:
    d = Daemon(str(module_tmp / "kvd.sock"), ["--max-bytes", "64M"], module_tmp / "kvd.log")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def engine_a(tiny_model: str, kvd: Daemon, module_tmp: Path) -> EngineRun:
    steps: list[dict[str, Any]] = [
        {"op": "generate", "name": "p1-no-daemon", "prompt": P1},
        {"op": "wait_for_daemon"},
        {"op": "sleep", "seconds": 1.5},  # the connector retries after 1 s
        {"op": "generate", "name": "p1", "prompt": P1},
        {"op": "generate", "name": "p2", "prompt": P2, "retention": "none"},
        {"op": "generate", "name": "p3", "prompt": P3, "retention": "short"},
        {"op": "generate", "name": "p4", "prompt": P4},
        {"op": "keys", "name": "p1-keys", "prompt": P1},
        {"op": "keys", "name": "p2-keys", "prompt": P2},
        {"op": "keys", "name": "p3-keys", "prompt": P3},
    ]
    # 384-token steps: a prompt's chunks complete over several steps (chunked prefill).
    return run_engine(
        tiny_model,
        steps,
        socket=kvd.socket,
        workdir=module_tmp,
        on_wait=kvd.start,
        engine_kw={"max_num_batched_tokens": 384},
    )


@pytest.fixture(scope="module")
def engine_b(tiny_model: str, kvd: Daemon, module_tmp: Path, engine_a: EngineRun) -> EngineRun:
    steps: list[dict[str, Any]] = [
        {"op": "generate", "name": "p1", "prompt": P1},
        {"op": "generate", "name": "p2", "prompt": P2},
        {"op": "generate", "name": "p3", "prompt": P3},
        {"op": "generate", "name": "p4", "prompt": P4},
        {"op": "statctl", "name": "stats"},
        {"op": "noise", "name": "noise", "prompt": P1},
        {"op": "reset_prefix_cache"},
        {"op": "generate", "name": "p1-noise", "prompt": P1},
    ]
    return run_engine(tiny_model, steps, socket=kvd.socket, workdir=module_tmp)


def test_engine_without_daemon_serves_by_recompute(engine_a: EngineRun) -> None:
    first = engine_a["p1-no-daemon"]
    assert len(first["tokens"]) == 8
    assert first["external_hits"] == 0
    assert first["tokens"] == engine_a["p1"]["tokens"]
    for role in ("vllm-scheduler", "vllm-worker-0"):
        assert engine_a.log.count(f"infera-kvd {role}: daemon at") == 1, "each half logs the outage once"
        assert f"infera-kvd {role}: reconnected" in engine_a.log


def test_engine_a_stores_the_long_prompt(engine_a: EngineRun) -> None:
    keys = engine_a["p1-keys"]
    assert len(keys["keys"]) == len(P1) // CHUNK == 3
    assert keys["present"] == 3


def test_fresh_engine_gets_external_hits_with_the_same_tokens(
    engine_a: EngineRun, engine_b: EngineRun
) -> None:
    b = engine_b["p1"]
    assert b["external_hits"] == 3 * CHUNK
    assert b["external_queries"] == len(P1)
    assert b["num_cached_tokens"] == 3 * CHUNK
    assert b["tokens"] == engine_a["p1"]["tokens"]


def test_a_prompt_of_whole_chunks_loads_all_but_the_last_block(
    engine_a: EngineRun, engine_b: EngineRun
) -> None:
    b = engine_b["p4"]
    block = 128  # the CPU backend's block size
    assert b["external_hits"] == len(P4) - block, "only the block holding the last token is recomputed"
    assert b["tokens"] == engine_a["p4"]["tokens"]


def test_statctl_counters_after_the_hit(engine_b: EngineRun) -> None:
    stats = engine_b["stats"]["stats"]
    assert stats["sets_total"] > 0
    assert stats["gets_total"] > 0
    assert stats["hits_total"] > 0
    assert stats["misses_total"] == 0


def test_engines_declare_namespace_and_hash_settings(engine_b: EngineRun, engine_a: EngineRun) -> None:
    stats = engine_b["stats"]["stats"]
    engines = [c for c in stats["clients"] if c["role"].startswith("vllm-")]
    assert {c["role"] for c in engines} == {"vllm-scheduler", "vllm-worker-0"}
    assert {c["namespace"] for c in engines} == {engine_a["p1-keys"]["namespace"]}
    assert all(c["hash_fingerprint"] and c["hash_settings"]["algo"] == "sha256" for c in engines)
    assert all(c["chunk_tokens"] == CHUNK for c in engines)
    assert stats["warnings"] == []


def test_overwritten_chunks_change_the_tokens(engine_a: EngineRun, engine_b: EngineRun) -> None:
    assert engine_b["noise"]["overwritten"] == 3
    noisy = engine_b["p1-noise"]
    assert noisy["external_hits"] == 3 * CHUNK, "the noisy chunks were loaded"
    assert noisy["tokens"] != engine_a["p1"]["tokens"], "so the loaded KV is really used"


def test_retention_none_stores_nothing(engine_a: EngineRun, engine_b: EngineRun) -> None:
    assert len(engine_a["p2-keys"]["keys"]) == 2
    assert engine_a["p2-keys"]["present"] == 0
    assert engine_b["p2"]["external_hits"] == 0
    assert engine_b["p2"]["tokens"] == engine_a["p2"]["tokens"]


def test_retention_short_is_stored_in_ram(engine_a: EngineRun, engine_b: EngineRun) -> None:
    assert engine_a["p3-keys"]["present"] == 2
    assert engine_b["p3"]["external_hits"] == 2 * CHUNK
    assert engine_b["p3"]["tokens"] == engine_a["p3"]["tokens"]
    by_class = engine_b["stats"]["stats"]["chunks_by_class"]
    assert by_class.get("short") == 2
