"""InferaKvdConnector's Prometheus metrics, served on vLLM's own ``/metrics``.

vLLM builds this once in the API-server process (``build_prom_metrics``) with its metric classes
and its labels (``model_name``, ``engine``), and hands it each step's stats dict
(:mod:`infera.engine.vllm.stats`). Names follow vLLM's: a ``vllm:`` prefix, counters that
Prometheus shows with ``_total``, seconds and bytes. The transfer counters and size histograms use
the offloading connector's names (``vllm:kv_offload_{load,store}_{bytes,time,size}``), so the
panels of vLLM's own KV-cache dashboard chart kvd too; everything else is ``vllm:kvd_*``. When
another connector of the same engine already registered the shared names (an OffloadingConnector
beside kvd in a MultiConnector), kvd's copies are registered as ``vllm:kvd_{load,save}_*``.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from infera.engine.vllm.stats import LOAD_FAILURES, SAVE_DROPS, TIERS

log = logging.getLogger("infera.engine.vllm")

# bytes per load or save step: one chunk of a small model is ~100 KB, a step of a large one GBs
SIZE_BUCKETS = (1e4, 1e5, 1e6, 5e6, 1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 1.5e8, 2e8, 5e8, 1e9, 4e9)
SECONDS_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# (stats counter, metric, help): vLLM's offloading names, and kvd's fallback name for each
SHARED = {
    "loaded_bytes": ("vllm:kv_offload_load_bytes", "vllm:kvd_load_bytes", "Bytes kvd loaded into the KV cache."),
    "load_seconds": ("vllm:kv_offload_load_time", "vllm:kvd_load_time_seconds", "Time kvd spent loading, in seconds."),
    "saved_bytes": ("vllm:kv_offload_store_bytes", "vllm:kvd_save_bytes", "Bytes kvd saved from the KV cache."),
    "save_seconds": ("vllm:kv_offload_store_time", "vllm:kvd_save_time_seconds", "Time kvd spent saving, in seconds."),
}  # fmt: skip
SHARED_SIZES = {
    "load_bytes": ("vllm:kv_offload_load_size", "vllm:kvd_load_size_bytes", "Bytes per kvd load step."),
    "save_bytes": ("vllm:kv_offload_store_size", "vllm:kvd_save_size_bytes", "Bytes per kvd save step."),
}
OWN = {
    "loaded_chunks": ("vllm:kvd_loaded_chunks", "Chunks kvd loaded into the KV cache."),
    "saved_chunks": ("vllm:kvd_saved_chunks", "Chunks kvd saved from the KV cache."),
    "lookups": ("vllm:kvd_lookups", "LOOKUP requests to the kvd daemon."),
    "lookup_errors": (
        "vllm:kvd_lookup_errors",
        "LOOKUPs that failed (daemon unreachable); counted as misses.",
    ),
    "skipped_policy_tokens": (
        "vllm:kvd_policy_skipped_tokens",
        "Prompt tokens kvd held but did not load because INFERA_KVD_LOAD_POLICY=never.",
    ),
    "prewarmed_chunks": (
        "vllm:kvd_prewarmed_chunks",
        "Long-tier chunks kvd asked the daemon to promote into RAM instead of loading them.",
    ),
}
DURATIONS = {
    "load_seconds": ("vllm:kvd_load_duration_seconds", "Wall time of one kvd load step."),
    "save_seconds": ("vllm:kvd_save_duration_seconds", "Wall time of one kvd save step."),
}
HITS = (
    "vllm:kvd_hit_tokens",
    "Prompt tokens kvd supplied, by the tier that held them (ram, disk, distributed).",
)
SKIPPED = (
    "vllm:kvd_skipped_slower_tokens",
    "Prompt tokens kvd held but recomputed: loading them was judged slower, by tier.",
)
FAILED = ("vllm:kvd_failed_loads", "Chunks kvd could not load (vLLM recomputed them), by reason.")
DROPPED = ("vllm:kvd_dropped_saves", "Chunks kvd did not save (a future miss), by reason.")
PATH = ("vllm:kvd_data_path_info", "1 for the data path the workers use (arena, arena-pinned, ...).")
FALLBACK = ("vllm:kvd_data_path_fallback", "1 while a worker runs a fallback data path (see kvd stat).")

METRIC_NAMES = (
    *(names[0] for names in SHARED.values()),
    *(names[0] for names in SHARED_SIZES.values()),
    *(names[0] for names in OWN.values()),
    *(names[0] for names in DURATIONS.values()),
    HITS[0],
    SKIPPED[0],
    FAILED[0],
    DROPPED[0],
    PATH[0],
    FALLBACK[0],
)  # as registered; Prometheus shows counters with _total, histograms as _bucket/_sum/_count


class KvdPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, Any] = {}
        self._histograms: dict[str, Any] = {}
        for key, (shared, own, doc) in SHARED.items():
            self._counters[key] = self._make(self._counter_cls, shared, own, doc)
        for key, (shared, own, doc) in SHARED_SIZES.items():
            self._histograms[key] = self._make(self._histogram_cls, shared, own, doc, buckets=SIZE_BUCKETS)
        for key, (name, doc) in OWN.items():
            self._counters[key] = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
        for key, (name, doc) in DURATIONS.items():
            self._histograms[key] = self._histogram_cls(
                name=name, documentation=doc, labelnames=labelnames, buckets=SECONDS_BUCKETS
            )
        self._hits = self._counter_cls(name=HITS[0], documentation=HITS[1], labelnames=[*labelnames, "tier"])
        self._skipped = self._counter_cls(
            name=SKIPPED[0], documentation=SKIPPED[1], labelnames=[*labelnames, "tier"]
        )
        self._failed = self._counter_cls(
            name=FAILED[0], documentation=FAILED[1], labelnames=[*labelnames, "reason"]
        )
        self._dropped = self._counter_cls(
            name=DROPPED[0], documentation=DROPPED[1], labelnames=[*labelnames, "reason"]
        )
        self._path = self._gauge_cls(
            name=PATH[0],
            documentation=PATH[1],
            labelnames=[*labelnames, "data_path"],
            multiprocess_mode="mostrecent",
        )
        self._fallback = self._gauge_cls(
            name=FALLBACK[0], documentation=FALLBACK[1], labelnames=labelnames, multiprocess_mode="mostrecent"
        )
        self._paths: dict[int, str] = {}
        # every series exists from the start (at 0), so dashboards and alerts see them before
        # the first hit, and rate() sees the first increase
        for values in per_engine_labelvalues.values():
            for metric in (*self._counters.values(), *self._histograms.values()):
                metric.labels(*values)
            for t in TIERS:
                self._hits.labels(*values, t)
                self._skipped.labels(*values, t)
            for w in LOAD_FAILURES:
                self._failed.labels(*values, w)
            for w in SAVE_DROPS:
                self._dropped.labels(*values, w)
            self._fallback.labels(*values).set(0)

    def _make(self, cls: Any, shared: str, own: str, doc: str, **kw: Any) -> Any:
        try:
            return cls(name=shared, documentation=doc, labelnames=self._labelnames, **kw)
        except ValueError:  # another connector of this engine registered vLLM's name already
            log.info("infera-kvd: %s is taken by another connector; kvd's is %s", shared, own)
            return cls(name=own, documentation=doc, labelnames=self._labelnames, **kw)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        values = self.per_engine_labelvalues[engine_idx]
        counters = transfer_stats_data.get("counters", {})
        for key, metric in self._counters.items():
            if counters.get(key):
                metric.labels(*values).inc(counters[key])
        for t in TIERS:
            if counters.get(f"hit_tokens_{t}"):
                self._hits.labels(*values, t).inc(counters[f"hit_tokens_{t}"])
            if counters.get(f"skipped_slower_tokens_{t}"):
                self._skipped.labels(*values, t).inc(counters[f"skipped_slower_tokens_{t}"])
        for w in LOAD_FAILURES:
            if counters.get(f"failed_loads_{w}"):
                self._failed.labels(*values, w).inc(counters[f"failed_loads_{w}"])
        for w in SAVE_DROPS:
            if counters.get(f"dropped_saves_{w}"):
                self._dropped.labels(*values, w).inc(counters[f"dropped_saves_{w}"])
        for key, samples in transfer_stats_data.get("samples", {}).items():
            metric = self._histograms.get(key)
            if metric is not None:
                bound = metric.labels(*values)
                for x in samples:
                    bound.observe(x)
        path = transfer_stats_data.get("path")
        if path:
            old = self._paths.get(engine_idx)
            if old is not None and old != path["data_path"]:
                self._path.labels(*values, old).set(0)
            self._paths[engine_idx] = path["data_path"]
            self._path.labels(*values, path["data_path"]).set(1)
            self._fallback.labels(*values).set(int(path["fallback"]))


__all__ = ["METRIC_NAMES", "KvdPromMetrics"]


def tolerate_children_without_prom_metrics() -> bool:
    """Make vLLM's ``MultiConnector`` Prometheus metrics skip a child that reports transfer stats
    but has no Prometheus metrics, instead of failing an assertion.

    vLLM (0.26 and 0.32, the releases we read) builds ``MultiKVConnectorPromMetrics`` from the
    children whose class returns metrics from ``build_prom_metrics`` (ours does), and its
    ``observe`` asserts that every child in a stats report is among them. ``MooncakeConnector`` reports transfer stats and has no
    Prometheus metrics, so a prefill leg with ``MultiConnector`` [``InferaKvdConnector``,
    ``MooncakeConnector``] lost its engine at the first Mooncake transfer (the API server's
    output handler raised ``AssertionError: MooncakeConnector is not contained in the list of
    registered connectors with Prometheus metrics support``; seen on an H200 with vLLM 0.26.0).
    The other children's stats still reach the log line ``KV Transfer metrics``.

    Called from ``InferaKvdConnector.build_prom_metrics``, which runs in the process that
    observes (the API server) before any stats arrive. Returns whether it patched now."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1 import multi_connector
    except ImportError:
        return False
    cls = getattr(multi_connector, "MultiKVConnectorPromMetrics", None)
    original = getattr(cls, "observe", None)
    if cls is None or original is None or getattr(original, "_infera_tolerant", False):
        return False

    def observe(self: Any, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        known = getattr(self, "_prom_metrics", None) or {}
        kept = {cid: data for cid, data in transfer_stats_data.items() if cid in known}
        if kept:
            original(self, kept, engine_idx)

    observe._infera_tolerant = True  # type: ignore[attr-defined]
    cls.observe = observe
    return True
