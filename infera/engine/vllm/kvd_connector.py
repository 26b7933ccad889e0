"""``InferaKvdConnector``: vLLM's view of the infera-kvd daemon (a thin facade).

Load it with::

    --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both",
                           "kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'

and ``INFERA_KVD_SOCKET`` naming the daemon's socket. vLLM builds one instance per role: the
scheduler instance delegates to :class:`SchedulerHalf`, each worker instance to
:class:`WorkerHalf`. vLLM imports this module by path, in the API-server process too, so
importing it does no work beyond importing vLLM's base class.

The connector supports vLLM's hybrid KV cache manager (``SupportsHMA``, every release we support),
so vLLM keeps it on for sliding-window and other hybrid models: every KV cache group is offloaded
with only the blocks vLLM reads (:mod:`infera.engine.vllm.groups`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from infera.engine.vllm import compat, events, hookup, notices, stats
from infera.engine.vllm.config import layerwise_requested, read_env
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import InferaKvdMetadata
from infera.engine.vllm.scheduler.loadcost import DEFAULT_GBPS, DEFAULT_PREFILL_TPS, CostModel
from infera.engine.vllm.stats import KvdConnectorStats, StatsSource
from infera.kvd.protocol import default_socket_path

if TYPE_CHECKING:
    import torch

log = logging.getLogger("infera.engine.vllm")


hookup.adopt_vllm_logging()
hookup.register_by_name(__name__)
_HIT_SOURCE, _TIER_SOURCE = hookup.HIT_SOURCE, hookup.TIER_SOURCE


class InferaKvdConnector(KVConnectorBase_V1, SupportsHMA):
    """Offloads prompt KV to the per-host kvd daemon and loads it back on a hit."""

    if _HIT_SOURCE is not None:
        _cache_hit_source = _HIT_SOURCE

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        env = read_env()
        self._env = env
        ns = compat.namespace_for(vllm_config, env, kv_cache_config)
        facts = compat.engine_facts(vllm_config, kv_cache_config)
        rank, world = compat.rank_info(vllm_config)
        socket_path = env.socket or default_socket_path()
        blockers = compat.offload_blockers(vllm_config, kv_cache_config)
        plan = compat.group_plan(vllm_config, kv_cache_config, ns.chunk_tokens)
        self._plan = plan
        failure = "blocks"
        if plan.hybrid:
            failure = "requests" if compat.can_fail_requests() else "none"
        self._scheduler: Any = None
        self._worker: Any = None
        self._stats: StatsSource | None = None
        link = DaemonLink(
            socket_path,
            ns,
            role="vllm-scheduler" if role == KVConnectorRole.SCHEDULER else f"vllm-worker-{rank}",
            name=f"vllm:{os.path.basename(facts.model.rstrip('/'))}",
            model=facts.model,
            want_arena=role != KVConnectorRole.SCHEDULER,
            kv_layout=_kv_layout(vllm_config, facts, plan, rank, failure),
            spin_us=env.spin_us,
        )
        if role == KVConnectorRole.SCHEDULER:
            from infera.engine.vllm.scheduler.half import SchedulerHalf

            ktc = self._kv_transfer_config
            use = notices.role_use(getattr(ktc, "kv_role", None))
            notices.log_start(
                facts,
                chunk_tokens=ns.chunk_tokens,
                max_model_len=getattr(getattr(vllm_config, "model_config", None), "max_model_len", None),
                use=use,
                extra_config=getattr(ktc, "kv_connector_extra_config", None),
                failure_policy=getattr(ktc, "kv_load_failure_policy", "recompute"),
            )
            reason = None
            if blockers:
                reason = "; ".join(f"{b.name}: {b.reason}" for b in blockers)
                log.warning("infera-kvd: no lookups or saves for this engine (%s)", reason)
            elif plan.hybrid:
                log.info(
                    "infera-kvd: %d KV cache groups (the hybrid KV cache manager is on): %s; load "
                    "failures reach vLLM %s",
                    len(plan.groups),
                    plan.summary(),
                    "per request (asynchronous loads)"
                    if failure == "requests"
                    else "not at all before vLLM 0.30 (lookups make sure chunks are in RAM and held)",
                )
            self._scheduler = SchedulerHalf(
                ns,
                block_size=facts.block_size,
                hash_block_size=facts.hash_block_size,
                ranks=1 if facts.replicated else world,
                link=link,
                disabled_reason=reason,
                events=events.KvdEvents(chunk_tokens=ns.chunk_tokens, hash_block_size=facts.hash_block_size)
                if events.enabled_in(vllm_config)
                else None,
                plan=plan,
                failure=failure,
                policy=env.load_policy,
                costs=CostModel(
                    chunk_bytes=max(1, facts.bytes_per_token * ns.chunk_tokens),  # until a worker says
                    gbps={**DEFAULT_GBPS, **env.load_gbps},
                    prefill_tps=env.prefill_tps or DEFAULT_PREFILL_TPS,
                ),
                report_every_s=env.report_every_s,
                loads=use.loads,
                saves=use.saves,
            )
            self._stats = StatsSource(stats.counters_of(self._scheduler), stats.SCHEDULER_COUNTERS)
            if self._scheduler.enabled:
                link.client()
            log.info(
                "infera-kvd: connector ready (namespace %s, chunk %d tokens, weights %s, daemon %s)",
                ns.name,
                ns.chunk_tokens,
                ns.weights or "?",
                socket_path,
            )
        else:
            from infera.engine.vllm.worker.half import WorkerHalf, block_count

            self._worker = WorkerHalf(
                ns,
                env,
                rank=rank,
                replicated=facts.replicated,
                link=link,
                blockers=blockers,
                num_blocks=block_count(kv_cache_config),
                block_size=facts.block_size,
                plan=plan,
                failure=failure,
                gpu_path_on_cpu=env.gpu_path_on_cpu,
            )
            self._stats = StatsSource(
                stats.counters_of(self._worker), stats.WORKER_COUNTERS, stats.worker_path(self._worker)
            )

    # -- properties vLLM asks about -----------------------------------------------------------
    @property
    def requires_kv_delivery(self) -> bool:
        """A cache, not a hand-off: a dropped save is a future miss, never lost output."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Layer-wise loads need vLLM to call ``wait_for_layer_load``, which a full CUDA graph's
        replay skips: with them on, vLLM keeps attention out of its graphs (PIECEWISE)."""
        return layerwise_requested()

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """No: a hit restores attention KV only, never a lagging recurrent state (vLLM 0.28+)."""
        return False

    # -- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._worker is not None:
            self._worker.register(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, InferaKvdMetadata):
            try:
                self._worker.step_started(connector_metadata)
            except Exception:  # timing is never worth a failed step
                log.debug("infera-kvd: step timing failed", exc_info=True)

    def build_connector_worker_meta(self) -> Any:
        """vLLM 0.18+: the workers' load and step timings, for the scheduler's cost model."""
        try:
            return self._worker.timings.take() if self._worker is not None else None
        except Exception:
            log.debug("infera-kvd: step timing failed", exc_info=True)
            return None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if self._worker is not None and isinstance(meta, InferaKvdMetadata):
            if meta.loads:
                stats.timed_call(self._stats, self._worker, "load", lambda: self._worker.load(meta))
            else:
                self._worker.load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Layer-wise loads (``INFERA_KVD_LOAD_LAYERWISE=1``) copy ``layer_name``'s KV here."""
        if self._worker is not None:
            self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if self._worker is not None and isinstance(meta, InferaKvdMetadata):
            try:
                self._worker.finish_layers()
                self._worker.timings.step_ended()
            except Exception:
                log.exception("infera-kvd: finishing this step's loads failed")
            if meta.saves and self._worker.saves_here:
                stats.timed_call(self._stats, self._worker, "save", lambda: self._worker.save(meta))
            else:
                self._worker.save(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Saves never outlive their step; asynchronous loads (hybrid models) end in the step
        that ran them."""
        if self._worker is None:
            return None, None
        done, _failed = self._worker.take_finished_loads()
        return None, done or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        """vLLM 0.30+: as get_finished, with failed loads (a hybrid model recomputes the request)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

        done: set[str] = set()
        failed: set[str] = set()
        if self._worker is not None:
            done, failed = self._worker.take_finished_loads()
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def handle_preemptions(self, arg: Any = None) -> None:
        """Saves finish inside the step that computed them, so preemption has nothing to flush."""
        return None

    # -- stats, metrics and events (either side) ------------------------------------------------
    def get_kv_connector_stats(self) -> KvdConnectorStats | None:
        """What this instance moved since vLLM last asked (vLLM sums workers and scheduler)."""
        try:
            return self._stats.take() if self._stats is not None else None
        except Exception:  # stats must never fail a step
            log.debug("infera-kvd: stats failed", exc_info=True)
            return None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvdConnectorStats | None:
        return KvdConnectorStats(data=dict(data)) if data is not None else KvdConnectorStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> Any:
        from infera.engine.vllm.promstats import KvdPromMetrics, tolerate_children_without_prom_metrics

        # as a MultiConnector child next to MooncakeConnector (P/D), whose stats have no metrics
        tolerate_children_without_prom_metrics()
        return KvdPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict[Any, int]:
        """vLLM 0.32+: our tokens as ``host`` (RAM tier), ``disk`` or ``p2p`` (distributed tier)."""
        if num_external_tokens <= 0:
            return {}
        try:
            by_tier = self._scheduler.hit_sources(request, num_external_tokens)
            out: dict[Any, int] = {}
            for tier, n in by_tier.items():
                source = _TIER_SOURCE[tier]
                out[source] = out.get(source, 0) + n
            return out
        except Exception:
            log.debug("infera-kvd: hit sources failed", exc_info=True)
            return {_HIT_SOURCE: num_external_tokens} if _HIT_SOURCE is not None else {}

    def take_events(self) -> list[Any]:
        ev = getattr(self._scheduler, "events", None)
        return ev.take() if ev is not None else []

    def shutdown(self) -> None:
        for half in (self._worker, self._scheduler):
            link = getattr(half, "link", None)
            if link is not None:
                link.close()

    # -- scheduler side ----------------------------------------------------------------------
    # Each scheduler hook runs on vLLM's scheduling thread, ahead of every request's step: its
    # wall time is added up in ``sched_us`` (the bench splits it per request).
    def _sched_time(self, started: float) -> None:
        self._scheduler.counters["sched_us"] += int((time.perf_counter() - started) * 1e6)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        started = time.perf_counter()
        try:
            return self._scheduler.matched_tokens(request, num_computed_tokens)
        except Exception:
            log.exception("infera-kvd: lookup failed; treating the request as a miss")
            return 0, False
        finally:
            self._sched_time(started)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        started = time.perf_counter()
        try:
            self._scheduler.after_alloc(request, blocks, num_external_tokens)
        except Exception:
            log.exception("infera-kvd: could not plan a load; those tokens will be recomputed")
            self._scheduler.poison_load(request, blocks, num_external_tokens)
        finally:
            self._sched_time(started)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        started = time.perf_counter()
        meta: KVConnectorMetadata = self._scheduler.build_meta(scheduler_output)
        self._sched_time(started)
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        failed = getattr(connector_output, "failed_recving", None)
        if self._scheduler is not None and failed:
            self._scheduler.load_failed(failed)
        timings = getattr(connector_output, "kv_connector_worker_meta", None)
        if self._scheduler is not None and timings is not None:
            try:
                self._scheduler.observe(timings)
            except Exception:
                log.debug("infera-kvd: could not read the workers' timings", exc_info=True)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        """vLLM 0.32+: a load writes every offloaded group's blocks (and a hit is only offered when
        every group the model reads is offloaded)."""
        return self._plan.group_ids

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            self._scheduler.finished(request)
        return False, None

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """SupportsHMA: saves finish inside their step, so no group's blocks are kept."""
        if self._scheduler is not None:
            self._scheduler.finished(request)
        return False, None


def _kv_layout(vllm_config: Any, facts: Any, plan: Any, rank: int, failure: str) -> dict[str, Any]:
    """What ``kvd stat`` and ``kvd doctor`` show of this engine's KV layout (HELLO ``kv_layout``,
    bounded by :mod:`infera.kvlayout`)."""
    sc = getattr(vllm_config, "scheduler_config", None)
    hma = getattr(sc, "disable_hybrid_kv_cache_manager", None)
    out: dict[str, Any] = {
        "tp": facts.tp_size,
        "pp": facts.pp_size,
        "rank": rank,
        "dtype": facts.dtype,
        "kv_dtype": facts.kv_cache_dtype,
        "block_size": facts.block_size,
        "mla": facts.use_mla,
        "vllm": facts.vllm_version,
        "groups": plan.to_wire()[:64],
        "load_failures": {"blocks": "block ids", "requests": "failed requests", "none": "not reported"}[
            failure
        ],
    }
    if hma is not None:
        out["hma"] = not bool(hma)
    return out
