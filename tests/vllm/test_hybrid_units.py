"""Hybrid models without an engine: vLLM's group specs become plans, the scheduler half plans
per-group loads and saves from per-group block ids (null blocks outside a window), the worker half
round-trips every group through a real daemon, and vLLM keeps its hybrid KV cache manager on for
the connector, alone or under a MultiConnector whose children all support it.

Needs vLLM (run from a vLLM venv) and, for the round trip, a daemon; no model weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from connector_kit import engine_facts

from infera.engine.vllm import compat
from infera.engine.vllm import groups as G
from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.keys import make_namespace
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.scheduler.half import FAIL_NONE, FAIL_REQUESTS, SchedulerHalf
from infera.engine.vllm.worker.gpu.copier import ArenaPin
from infera.engine.vllm.worker.half import WorkerHalf

FACTS = engine_facts(model="/m/g3", model_type="gemma3_text", num_layers=3, head_size=8)
CT = 128  # 8 blocks of 16 tokens per chunk


@pytest.fixture(autouse=True)
def _our_logger_as_it_was() -> Any:
    """Importing the connector module routes our logger through vLLM's handlers (no propagation);
    later test modules capture our warnings with caplog, so put it back."""
    lg = logging.getLogger("infera.engine.vllm")
    saved = (list(lg.handlers), lg.propagate, lg.level)
    yield
    lg.handlers[:], lg.propagate = saved[0], saved[1]
    lg.setLevel(saved[2])


def kv_config(*groups: tuple[list[str], Any]) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(n, s) for n, s in groups]
    )


def specs() -> dict[str, Any]:
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    common = dict(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    return {
        "full": FullAttentionSpec(**common),
        "sliding": SlidingWindowSpec(**common, sliding_window=50),
        "chunked": ChunkedLocalAttentionSpec(**common, attention_chunk_size=512),
        "mamba": MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.bfloat16,)),
    }


def vllm_config() -> Any:
    return SimpleNamespace(cache_config=SimpleNamespace(block_size=16, cache_dtype="auto"))


def test_vllm_group_specs_become_plans() -> None:
    s = specs()
    cfg = kv_config((["l.0"], s["sliding"]), (["l.1"], s["full"]), (["l.2"], s["chunked"]))
    plan = compat.group_plan(vllm_config(), cfg, CT)
    assert [(g.kind, g.window, g.attention_chunk, g.layers) for g in plan.groups] == [
        ("sliding", 50, None, ("l.0",)),
        ("full", None, None, ("l.1",)),
        ("chunked", None, 512, ("l.2",)),
    ]
    assert plan.hybrid and plan.group_ids == (0, 1, 2)
    assert compat.offload_blockers(vllm_config(), cfg) == []


def test_a_recurrent_state_group_is_one_blocker_naming_the_group() -> None:
    s = specs()
    cfg = kv_config((["l.0", "l.2"], s["full"]), ([f"m.{i}" for i in range(24)], s["mamba"]))
    (blocker,) = compat.offload_blockers(vllm_config(), cfg)
    assert blocker.name.startswith("group 1 (24 recurrent state layers, e.g. m.0)")
    assert "not offered as hits" in blocker.reason
    plan = compat.group_plan(vllm_config(), cfg, CT)
    assert G.blockers(plan) == [plan.groups[1]]


def test_the_connector_supports_vllms_hybrid_manager() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

    from infera.engine.vllm.kvd_connector import InferaKvdConnector

    assert supports_hma(InferaKvdConnector)
    assert callable(InferaKvdConnector.request_finished_all_groups)
    assert InferaKvdConnector.supports_divergent_local_hybrid_hits.fget(None) is False  # type: ignore[attr-defined]


# -- the scheduler half -------------------------------------------------------------------------
class FakeClient:
    long_tier = None

    def __init__(self, present: set[bytes], holds: int | None = None) -> None:
        self.present = present
        self.holds = holds  # how many keys the daemon holds at most (its --client-quota)
        self.calls: list[str] = []

    def lookup(self, keys: list[bytes], hold_ms: int = 0) -> int:
        self.calls.append(f"lookup:{len(keys)}")
        return next((i for i, k in enumerate(keys) if k not in self.present), len(keys))

    def lookup_tiers(self, keys: list[bytes], hold_ms: int = 0) -> tuple[int, list[int]]:
        return self.lookup(keys, hold_ms), []

    def hold(self, keys: list[bytes], hold_ms: int) -> tuple[int, int]:
        self.calls.append(f"hold:{len(keys)}")
        count = next((i for i, k in enumerate(keys) if k not in self.present), len(keys))
        return count, min(count, len(keys) if self.holds is None else self.holds)

    def lease(self, keys: list[bytes], ram_only: bool = False) -> list[Any]:
        self.calls.append(f"lease:{len(keys)}")
        return [(i, 0, 0) if k in self.present else None for i, k in enumerate(keys)]

    def release(self, tokens: list[int]) -> None:
        self.calls.append(f"release:{len(tokens)}")


class FakeLink:
    def __init__(self, client: FakeClient) -> None:
        self.c = client
        self.counters: dict[str, int] = {}

    def call(self, fn: Any) -> Any:
        return fn(self.c)

    def report(self, **_: Any) -> None:
        return None


PLAN = G.Plan(
    (G.GroupPlan(0, G.FULL, 16, num_layers=1), G.GroupPlan(1, G.SLIDING, 16, window=50, num_layers=1)), CT
)


def scheduler(
    present: set[bytes] | None = None, failure: str = FAIL_REQUESTS
) -> tuple[SchedulerHalf, FakeClient]:
    ns = make_namespace(FACTS, CT)
    client = FakeClient(present or set())
    half = SchedulerHalf(
        ns, block_size=16, hash_block_size=16, ranks=1, link=FakeLink(client), plan=PLAN, failure=failure
    )  # type: ignore[arg-type]
    return half, client


def request(n: int, rid: str = "r1") -> Any:
    return SimpleNamespace(
        request_id=rid, num_tokens=n, num_prompt_tokens=n, prompt_token_ids=list(range(n)),
        block_hashes=[bytes([i]) * 32 for i in range(n // 16)], kv_transfer_params=None,
    )  # fmt: skip


def blocks(*per_group: list[int]) -> Any:
    return SimpleNamespace(get_block_ids=lambda: tuple(per_group))


def test_scheduler_saves_each_groups_own_blocks_and_never_a_null_block() -> None:
    half, _ = scheduler()
    req = request(300)
    assert half.matched_tokens(req, 0) == (0, False)
    full_ids, swa_ids = list(range(1, 20)), list(range(20, 39))
    out = SimpleNamespace(
        num_scheduled_tokens={"r1": 300},
        scheduled_new_reqs=[SimpleNamespace(req_id="r1", block_ids=(full_ids, swa_ids), num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
    )  # fmt: skip
    meta = half.build_meta(out)
    (job,) = meta.saves
    got = [(ch.group, ch.block_ids) for ch in job.chunks]
    # the window (50 tokens) reads 4 blocks at a chunk end: the last 4 of each chunk's 8
    assert got == [(0, full_ids[0:8]), (1, swa_ids[4:8]), (0, full_ids[8:16]), (1, swa_ids[12:16])]

    half2, _ = scheduler()
    half2.matched_tokens(request(300, "r2"), 128)  # a local hit: its sliding blocks were freed
    swa_nulls = [0] * 5 + list(range(40, 54))
    out.scheduled_new_reqs = [
        SimpleNamespace(req_id="r2", block_ids=(full_ids, swa_nulls), num_computed_tokens=128)
    ]
    out.num_scheduled_tokens = {"r2": 172}
    (job2,) = half2.build_meta(out).saves
    assert [(ch.group, ch.block_ids) for ch in job2.chunks] == [(0, full_ids[8:16]), (1, swa_nulls[12:16])]
    assert half2.counters["save_skipped_outside_window"] == 1  # chunk 0: null blocks, not saved


def test_scheduler_loads_only_blocks_inside_the_window_asynchronously() -> None:
    ns = make_namespace(FACTS, CT)
    keys, _ = G.plan_keys(PLAN, ns.digest, [bytes([i]) * 32 for i in (7, 15)], 1)
    half, client = scheduler(set(keys))
    req = request(300)
    assert half.matched_tokens(req, 0) == (256, True)  # vLLM 0.30+: failures per request
    # vLLM's blocks for a 256-token hit: full attention all, the sliding group nulls up to the
    # window of token 256 (skipped(256) = 207 tokens = 12 blocks)
    full_ids, swa_ids = list(range(1, 20)), [0] * 12 + list(range(30, 37))
    half.after_alloc(req, blocks(full_ids, swa_ids), 256)
    (load,) = half.build_meta(
        SimpleNamespace(
            num_scheduled_tokens={}, scheduled_new_reqs=[], scheduled_cached_reqs=SimpleNamespace(req_ids=[])
        )
    ).loads
    assert load.notify and not load.fail
    assert [(ch.group, ch.block_ids, ch.skip, ch.stop) for ch in load.chunks] == [
        (0, full_ids[0:8], 0, None),
        (0, full_ids[8:16], 0, None),
        (1, swa_ids[12:16], 0, None),  # chunk 0 holds nothing the hit reads of the window
    ]
    assert client.calls == ["lookup:4"]


def test_a_prompt_of_whole_chunks_is_cut_back_to_a_boundary_the_window_holds() -> None:
    ns = make_namespace(FACTS, CT)
    keys, _ = G.plan_keys(PLAN, ns.digest, [bytes([i]) * 32 for i in (7, 15)], 1)
    half, _ = scheduler(set(keys))
    # 256 tokens: the most vLLM takes is 240 (the last block is recomputed), inside chunk 1,
    # whose stored window tail does not cover a hit ending there
    assert half.matched_tokens(request(256), 0) == (128, True)
    assert half.counters["hit_tokens_cut_to_chunk"] == 112


def test_before_vllm_030_lookups_make_sure_every_chunk_is_in_ram() -> None:
    ns = make_namespace(FACTS, CT)
    keys, _ = G.plan_keys(PLAN, ns.digest, [bytes([i]) * 32 for i in (7, 15)], 1)
    half, client = scheduler(set(keys), failure=FAIL_NONE)
    assert half.matched_tokens(request(300), 0) == (256, False)  # synchronous: no per-request failure
    assert client.calls == ["lookup:4", "lease:4", "release:4", "hold:4"]
    half.load_failed(["r1"])
    assert half.matched_tokens(request(300), 0) == (0, False)


def test_before_vllm_030_a_lookup_offers_only_what_the_daemon_holds() -> None:
    """The daemon holds no more than the connection's --client-quota: a chunk it does not hold
    could go before the load, which this vLLM cannot take back, so it is not offered."""
    ns = make_namespace(FACTS, CT)
    keys, _ = G.plan_keys(PLAN, ns.digest, [bytes([i]) * 32 for i in (7, 15)], 1)
    half, client = scheduler(set(keys), failure=FAIL_NONE)
    client.holds = 3  # of the 4 keys (2 chunks x 2 groups): the first chunk is held whole
    assert half.matched_tokens(request(300), 0) == (128, False)
    assert half.counters["verify_unheld_chunks"] == 1


def test_a_load_that_cannot_be_planned_fails_the_request_not_blocks() -> None:
    half, _ = scheduler()
    half.poison_load(request(300), blocks([1, 2], [3, 4]), 128)
    (job,) = half.pending_loads
    assert job.fail and job.notify and not job.chunks


# -- the worker half ----------------------------------------------------------------------------
def hma_caches(num_blocks: int = 32) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One buffer shared by a layer of each group, as vLLM's hybrid manager allocates it."""
    buf = torch.randn(num_blocks, 2, 16, 16).to(torch.bfloat16)
    return buf, {"l.full": buf, "l.swa": buf}


@pytest.mark.parametrize("gpu_path", [False, True], ids=["cpu-path", "gpu-path-on-cpu"])
def test_worker_round_trips_every_group_and_reports_async_loads(daemon: Any, gpu_path: bool) -> None:
    """Both copy paths: plain gathers, and the GPU path's code (one copier per group, staging
    split between them, one RELEASE once every group's copies are done) on CPU stand-ins."""
    ns = make_namespace(FACTS, CT)
    plan = G.Plan(
        (
            G.GroupPlan(0, G.FULL, 16, num_layers=1, layers=("l.full",)),
            G.GroupPlan(1, G.SLIDING, 16, window=50, num_layers=1, layers=("l.swa",)),
            G.GroupPlan(2, G.FULL, 16, num_layers=1, layers=()),  # a pipeline stage without its layers
        ),
        CT,
    )
    link = DaemonLink(daemon.socket, ns, role="vllm-worker-0", name="t", model="/m/g3", want_arena=True)
    w = WorkerHalf(
        ns, ConnectorEnv(socket=daemon.socket), rank=0, replicated=False, link=link, blockers=[],
        num_blocks=32, block_size=16, plan=plan, failure="requests", gpu_path_on_cpu=gpu_path,
    )  # fmt: skip
    w.pin = ArenaPin(register=lambda _p, _s: None, unregister=lambda _p: None)
    buf, kv = hma_caches()
    w.register(kv)
    assert w.layouts[2] is None and w.disabled_reason is None
    if gpu_path:
        assert sorted(w.gpus) == [0, 1] and w.gpus[1].bpc == 4 and w.gpus[0].bpc == 8
    full_ids, swa_ids = [1, 2, 3, 4, 5, 6, 7, 8], [20, 21, 22, 23]
    h = b"h" * 32
    save = RequestJob(
        "r1", [ChunkJob(h, full_ids, group=0), ChunkJob(h, swa_ids, group=1), ChunkJob(h, [], group=2)]
    )
    w.save(InferaKvdMetadata(saves=[save]))
    for gpu in w.gpus.values():
        gpu.drain()  # the GPU path seals once its copies are done
    assert w.counters["save_chunks"] == 3
    want = buf[full_ids + swa_ids].clone()
    buf[full_ids + swa_ids] = 0
    load = RequestJob(
        "r1",
        [ChunkJob(h, full_ids, group=0), ChunkJob(h, swa_ids, 1, None, 1), ChunkJob(h, [], group=2)],
        notify=True,
    )
    w.load(InferaKvdMetadata(loads=[load]))
    for gpu in w.gpus.values():
        gpu.drain()
    assert torch.equal(buf[full_ids + swa_ids[1:]], torch.cat([want[:8], want[9:]]))
    assert torch.equal(buf[swa_ids[0]], torch.zeros_like(buf[0])), "skipped blocks are not written"
    assert w.take_finished_loads() == ({"r1"}, set())

    with daemon.client(namespace=ns.name, want_arena=False) as c:
        c.delete([w.key(ChunkJob(h, swa_ids, group=1))])
    w.load(InferaKvdMetadata(loads=[RequestJob("r2", load.chunks, notify=True)]))
    assert w.take_finished_loads() == ({"r2"}, {"r2"})
    assert w.take_load_errors() == set(), "several groups: never block ids (vLLM cannot map them)"

    w.failure = "none"  # vLLM < 0.30: nothing to report to; logged as an error and counted
    w.load(InferaKvdMetadata(loads=[RequestJob("r3", load.chunks)]))
    assert w.counters["load_failed_unreported"] == 1
    assert w.take_finished_loads() == (set(), set()) and w.take_load_errors() == set()
    w.close()


# -- vLLM's configuration: the hybrid manager stays on -------------------------------------------
@pytest.fixture(scope="module")
def gemma3_config_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("g3cfg")
    cfg = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096,
        "sliding_window": 700, "sliding_window_pattern": 6, "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def hma_disabled(model_dir: str, ktc: dict[str, Any]) -> bool:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, kv_transfer_config=ktc, enforce_eager=True)
    return bool(args.create_engine_config().scheduler_config.disable_hybrid_kv_cache_manager)


KVD = {
    "kv_connector": "InferaKvdConnector",
    "kv_role": "kv_both",
    "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
}


def test_vllm_keeps_the_hybrid_manager_on_alone_and_under_multiconnector(gemma3_config_dir: str) -> None:
    assert not hma_disabled(gemma3_config_dir, KVD)
    multi = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [KVD, dict(KVD)]},
    }
    assert not hma_disabled(gemma3_config_dir, multi), "every child supports it"
    example = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(Path(gemma3_config_dir) / "x")},
    }
    multi["kv_connector_extra_config"] = {"connectors": [KVD, example]}
    assert hma_disabled(gemma3_config_dir, multi), (
        "a child without SupportsHMA turns it off, as vLLM documents"
    )


# -- kvd bench gpu-e2e: the Gemma-3 row set builds (the run itself is on the H200) --------------
def test_gpu_e2e_gemma3_rows_build_and_keep_the_hybrid_manager_on(tmp_path: Path) -> None:
    from vllm.engine.arg_utils import EngineArgs

    from infera.bench.gpu_e2e_models import build_models, loaded_bytes

    models = build_models(tmp_path, [4096, 16384], small=False, check=False, hybrid=[16384])
    gemma = next(m for m in models if m["name"].startswith("Gemma-3-12B"))
    assert gemma["sizes"] == [16384] and gemma["disk"] is False and gemma["load_format"] == "dummy"
    cfg = json.loads((Path(gemma["path"]) / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["num_hidden_layers"] == 48
    assert cfg["layer_types"].count("sliding_attention") == 40
    # a 16k hit loads the 8 global layers' KV and the 40 sliding layers' last 1,024 tokens
    per_layer = 2 * 8 * 256 * 2
    assert loaded_bytes(gemma, 16384) == 16384 * 8 * per_layer + 1024 * 40 * per_layer
    for ktc in (
        KVD,
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30},
        },
    ):
        args = EngineArgs(
            model=gemma["path"], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
            max_model_len=gemma["max_model_len"], kv_transfer_config=ktc,
        )  # fmt: skip
        config = args.create_engine_config()
        assert not config.scheduler_config.disable_hybrid_kv_cache_manager, ktc["kv_connector"]
        assert config.model_config.hf_text_config.sliding_window == 1024


def test_a_daemon_restart_makes_the_policy_forget_its_long_tier_rates() -> None:
    """The link's connection count moves when the daemon restarts: the long tier's learned
    read rate (a warm page cache before the restart, say) goes back to the warm-up default."""
    half, _client = scheduler()
    link = half.link
    link.counters["connects"] = 1
    half.policy.costs.long_chunk_s["disk"] = 1e-4
    half.matched_tokens(request(4 * CT), 0)
    assert half.policy.costs.long_chunk_s == {"disk": 1e-4}  # the first connection: kept
    link.counters["connects"] = 2
    half.matched_tokens(request(4 * CT, "r2"), 0)
    assert half.policy.costs.long_chunk_s == {}
    assert half.counters["timing_long_rates_reset"] == 1
