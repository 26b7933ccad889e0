"""What the connector does with its kv-transfer-config and settings at start: ``kv_role`` decides
whether it loads hits (``kv_producer`` does not) and stores prompts (``kv_consumer`` does not);
a real engine says once what costs it hits (a chunk larger than ``max_model_len``, a random hash
seed and its real cause, a role other than ``kv_both``, ``kv_connector_extra_config`` keys it
does not read)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from connector_kit import engine_facts
from engines import CONNECTOR, engine_env, prompt, run_engine, vllm_version
from test_hybrid_units import FakeLink

from helpers import Daemon
from infera.engine.vllm import groups as G
from infera.engine.vllm.keys import make_namespace
from infera.engine.vllm.scheduler.half import SchedulerHalf

FACTS = engine_facts()
CT = 64  # 4 blocks of 16 tokens


class FakeClient:
    long_tier = None

    def __init__(self, present: set[bytes]) -> None:
        self.present = present
        self.holds: list[int] = []

    def lookup_tiers(self, keys: list[bytes], hold_ms: int = 0) -> tuple[int, list[int]]:
        self.holds.append(hold_ms)
        return next((i for i, k in enumerate(keys) if k not in self.present), len(keys)), []


def _half(stored_chunks: int, **kw: Any) -> tuple[SchedulerHalf, FakeClient]:
    ns = make_namespace(FACTS, CT)
    plan = G.single_group(16, CT)
    hashes = [bytes([CT // 16 * (c + 1) - 1]) * 32 for c in range(stored_chunks)]  # last block of each
    keys, _ = G.plan_keys(plan, ns.digest, hashes, 1)
    client = FakeClient(set(keys))
    half = SchedulerHalf(ns, block_size=16, hash_block_size=16, ranks=1, link=FakeLink(client), **kw)  # type: ignore[arg-type]
    return half, client


def _request(n: int) -> Any:
    return SimpleNamespace(
        request_id="r1", num_tokens=n, num_prompt_tokens=n, prompt_token_ids=list(range(n)),
        block_hashes=[bytes([i]) * 32 for i in range(n // 16)], kv_transfer_params=None,
    )  # fmt: skip


def _step(n: int) -> Any:
    return SimpleNamespace(
        total_num_scheduled_tokens=n,
        num_scheduled_tokens={"r1": n},
        scheduled_new_reqs=[SimpleNamespace(req_id="r1", block_ids=(list(range(1, 20)),), num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
    )  # fmt: skip


def test_kv_both_loads_the_hit_and_stores_the_rest() -> None:
    half, client = _half(2)
    assert half.matched_tokens(_request(300), 0) == (128, False)
    assert client.holds == [30_000]
    (job,) = half.build_meta(_step(300)).saves
    assert len(job.chunks) == 2  # chunks 2 and 3; 0 and 1 are the daemon's already


def test_kv_producer_stores_but_loads_no_hits() -> None:
    half, client = _half(2, loads=False)
    assert half.matched_tokens(_request(300), 0) == (0, False)
    assert client.holds == [0], "nothing held for a load that never comes"
    assert half.counters["hit_tokens"] == 0
    (job,) = half.build_meta(_step(300)).saves
    assert len(job.chunks) == 2, "what the daemon holds is still not stored again"


def test_kv_consumer_loads_hits_but_stores_nothing() -> None:
    half, _ = _half(2, saves=False)
    assert half.matched_tokens(_request(300), 0) == (128, False)
    meta = half.build_meta(_step(300))
    assert meta.saves == [] and half.counters["save_chunks"] == 0


# -- a real engine --------------------------------------------------------------------------------
P = prompt(5, 600)


@pytest.fixture(scope="module")
def consumer(tiny_model: str, kvd: Daemon, module_tmp: Path) -> Any:
    """One engine: kv_consumer, extra-config keys, a chunk larger than max_model_len, xxhash
    without PYTHONHASHSEED."""
    env = engine_env(kvd.socket, INFERA_KVD_CHUNK_TOKENS="100000", INFERA_KVD_REPORT_EVERY_S="0")
    env.pop("PYTHONHASHSEED", None)
    ktc = {
        **CONNECTOR,
        "kv_role": "kv_consumer",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"chunk_tokens": "abc", "socket": 5, "foo": 1},
    }
    steps = [{"op": "generate", "name": "p", "prompt": P}, {"op": "statctl", "name": "stats"}]
    return run_engine(
        tiny_model,
        steps,
        socket=kvd.socket,
        workdir=module_tmp,
        kv_transfer_config=ktc,
        env=env,
        engine_kw={"prefix_caching_hash_algo": "xxhash"},
    )


def _warnings(log: str, words: str) -> list[str]:
    return [ln for ln in log.splitlines() if words in ln and "WARNING" in ln]


def test_start_warnings_of_a_real_engine(consumer: Any) -> None:
    log = consumer.log
    (chunk,) = _warnings(log, "a chunk is ")
    got = re.search(r"a chunk is (\d+) tokens but max_model_len is 2048", chunk)
    assert got and int(got.group(1)) >= 100_000, chunk  # rounded up to whole blocks
    assert "INFERA_KVD_CHUNK_TOKENS" in chunk
    (role,) = _warnings(log, "kv_role is kv_consumer")
    assert "stores nothing" in role
    (extra,) = _warnings(log, "kv_connector_extra_config is not read")
    assert "chunk_tokens (use INFERA_KVD_CHUNK_TOKENS)" in extra and "foo" in extra
    (seed,) = _warnings(log, "draws a random seed per process")
    want = (
        "hash algorithm xxhash"
        if vllm_version() >= (0, 29)
        else f"vLLM {vllm_version()[0]}.{vllm_version()[1]}"
    )
    assert want in seed and "seeds block hashes randomly" not in log
    assert consumer["p"]["external_hits"] == 0


def test_a_consumer_stores_nothing(consumer: Any) -> None:
    stats = consumer["stats"]["stats"]
    assert stats["sets_total"] == 0
    assert {c["role"] for c in stats["clients"]} >= {"vllm-scheduler", "vllm-worker-0"}


# -- the entry point checks the settings before vLLM starts ---------------------------------------
@pytest.mark.parametrize(
    ("env", "lines"),
    [
        (
            {"INFERA_KVD_LOAD_POLICY": "sometimes"},
            ["error: INFERA_KVD_LOAD_POLICY='sometimes' must be auto, always or never"],
        ),
        (
            {"INFERA_KVD_REPORT_EVERY_S": "abc"},
            [
                "error: INFERA_KVD_REPORT_EVERY_S='abc' is not a number of seconds",
                "hint: e.g. INFERA_KVD_REPORT_EVERY_S=5 (the default); 0 reports after every step",
            ],
        ),
        (
            {"INFERA_KVD_SPIN_US": "abc"},
            [
                "error: INFERA_KVD_SPIN_US='abc' is not a whole number of microseconds",
                "hint: 0 (the default) waits for replies without polling; at most 100000",
            ],
        ),
    ],
)
@pytest.mark.parametrize("multi", [False, True])
def test_the_entry_point_refuses_a_bad_setting_in_one_line(
    tmp_path: Path, env: dict[str, str], lines: list[str], multi: bool
) -> None:
    ktc: dict[str, Any] = CONNECTOR
    if multi:
        ktc = {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"connectors": [CONNECTOR]},
        }
    res = subprocess.run(
        [sys.executable, "-m", "infera.engine.vllm", "--model", str(tmp_path / "none"), "--kv-transfer-config", json.dumps(ktc)],
        env={**engine_env(None), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.splitlines() == lines
    assert res.stdout == ""
