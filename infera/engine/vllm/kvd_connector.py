"""``InferaKvdConnector``: vLLM's view of the infera-kvd daemon (a thin facade).

Load it with::

    --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both",
                           "kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'

and ``INFERA_KVD_SOCKET`` naming the daemon's socket. vLLM builds one instance per role: the
scheduler instance delegates to :class:`SchedulerHalf`, each worker instance to
:class:`WorkerHalf`. vLLM imports this module by path, in the API-server process too, so
importing it does no work beyond importing vLLM's base class.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from infera.engine.vllm import compat, events, stats
from infera.engine.vllm.config import read_env
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import InferaKvdMetadata
from infera.engine.vllm.stats import KvdConnectorStats, StatsSource
from infera.kvd.protocol import default_socket_path

if TYPE_CHECKING:
    import torch

log = logging.getLogger("infera.engine.vllm")


def _adopt_vllm_logging() -> None:
    """Print our log lines through vLLM's handlers, so they look like (and sit with) vLLM's."""
    ours = logging.getLogger("infera.engine.vllm")
    theirs = logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level or logging.INFO)
    ours.propagate = False


_adopt_vllm_logging()

try:  # vLLM 0.32+: vllm:prompt_tokens_cached_by_source counts our hits by the tier that held them
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    _HIT_SOURCE: Any = CacheHitSource.HOST
    # the distributed tier is another host's store reached over the network: of vLLM's sources,
    # p2p ("transferred from another vLLM instance") is the nearest
    _TIER_SOURCE: dict[str, Any] = {
        "ram": CacheHitSource.HOST,
        "disk": CacheHitSource.DISK,
        "distributed": CacheHitSource.P2P,
    }
except ImportError:  # pragma: no cover - older vLLM
    _HIT_SOURCE = None
    _TIER_SOURCE = {}


def _register_by_name() -> None:
    """Under a MultiConnector the API-server process rebuilds each child's stats by class name
    (``KVConnectorFactory.get_connector_class_by_name``): make ours known by name too."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        if "InferaKvdConnector" not in KVConnectorFactory._registry:
            KVConnectorFactory.register_connector("InferaKvdConnector", __name__, "InferaKvdConnector")
    except Exception:  # pragma: no cover - a vLLM without a registry: stats stay per-connector
        log.debug("infera-kvd: could not register the connector by name", exc_info=True)


_register_by_name()


class InferaKvdConnector(KVConnectorBase_V1):
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
        self._scheduler: Any = None
        self._worker: Any = None
        self._stats: StatsSource | None = None
        if facts.hash_seed == "random" and role == KVConnectorRole.SCHEDULER:
            log.warning(
                "infera-kvd: vLLM %s seeds block hashes randomly per process (PYTHONHASHSEED unset), "
                "so chunks stored by this engine can never be found by another engine or after a "
                "restart; set the same PYTHONHASHSEED on every engine",
                facts.vllm_version,
            )
        link = DaemonLink(
            socket_path,
            ns,
            role="vllm-scheduler" if role == KVConnectorRole.SCHEDULER else f"vllm-worker-{rank}",
            name=f"vllm:{os.path.basename(facts.model.rstrip('/'))}",
            model=facts.model,
            want_arena=role != KVConnectorRole.SCHEDULER,
        )
        if role == KVConnectorRole.SCHEDULER:
            from infera.engine.vllm.scheduler.half import SchedulerHalf

            reason = None
            if blockers:
                reason = "; ".join(f"{b.name}: {b.reason}" for b in blockers)
                log.warning("infera-kvd: no lookups or saves for this engine (%s)", reason)
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
            )
            self._stats = StatsSource(stats.counters_of(self._scheduler), stats.SCHEDULER_COUNTERS)
            policy = getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute")
            if policy == "fail":
                log.warning(
                    "infera-kvd: kv_load_failure_policy is 'fail', so a chunk that disappears between "
                    "lookup and load fails its request; set it to 'recompute' (python -m "
                    "infera.engine.vllm does this for you)"
                )
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

    # -- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._worker is not None:
            self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if self._worker is not None and isinstance(meta, InferaKvdMetadata):
            if meta.loads:
                stats.timed_call(self._stats, self._worker, "load", lambda: self._worker.load(meta))
            else:
                self._worker.load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if self._worker is not None and isinstance(meta, InferaKvdMetadata):
            if meta.saves and self._worker.saves_here:
                stats.timed_call(self._stats, self._worker, "save", lambda: self._worker.save(meta))
            else:
                self._worker.save(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

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
        from infera.engine.vllm.promstats import KvdPromMetrics

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
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        try:
            return self._scheduler.matched_tokens(request, num_computed_tokens)
        except Exception:
            log.exception("infera-kvd: lookup failed; treating the request as a miss")
            return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        try:
            self._scheduler.after_alloc(request, blocks, num_external_tokens)
        except Exception:
            log.exception("infera-kvd: could not plan a load; those tokens will be recomputed")
            self._scheduler.poison_load(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta: KVConnectorMetadata = self._scheduler.build_meta(scheduler_output)
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            self._scheduler.finished(request)
        return False, None
