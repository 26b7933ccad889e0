"""Writes kvd.json, the Grafana dashboard: ``python deploy/grafana/dashboard.py`` (edit here, not there).

Rows: the daemon, its tiers, the data paths, the connector as vLLM reports it (``vllm:kvd_*`` and
the offload names vLLM's own KV-cache dashboard charts), and vLLM's own prefix-cache panels next
to them. Variables: the Prometheus data source, the kvd instance, the vLLM model.
tests/vllm/test_metrics.py checks that every metric named here exists in a live scrape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("kvd.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
K = 'instance=~"$instance"'  # the daemon's series
V = 'model_name=~"$model_name"'  # the engine's series


def over(fn: str, metric: str, sel: str = K) -> str:
    """``fn(metric{sel}[$__rate_interval])``: a counter's ``rate`` or ``increase`` over the panel's interval."""
    return f"{fn}({metric}{{{sel}}}[$__rate_interval])"


def rate(metric: str, sel: str = K) -> str:
    return over("rate", metric, sel)


def increase(metric: str, sel: str = K) -> str:
    return over("increase", metric, sel)


def quantile(q: float, histogram: str) -> str:
    """Quantile ``q`` of an engine histogram over all its series."""
    return f"histogram_quantile({q}, sum by (le) ({rate(histogram + '_bucket', V)}))"


RED_FROM_1 = [("green", None), ("red", 1)]  # a count that should stay 0

ROWS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "Daemon",
        [
            {"title": "Daemon up", "type": "stat", "w": 3, "targets": [(f'up{{job="kvd",{K}}}', "{{instance}}")]},
            {"title": "Uptime", "type": "stat", "w": 3, "unit": "s", "targets": [(f"kvd_uptime_seconds{{{K}}}", "{{instance}}")]},
            {"title": "Clients", "type": "stat", "w": 3, "targets": [(f"kvd_clients_connected{{{K}}}", "{{instance}}")]},
            {"title": "Hash conflicts", "type": "stat", "w": 3, "targets": [(f"kvd_hash_conflicts{{{K}}}", "{{instance}}")],
             "thresholds": RED_FROM_1},
            {"title": "Lookup hit ratio", "unit": "percentunit", "w": 6, "targets": [
                (f"sum by (instance) ({rate('kvd_lookup_hit_keys_total')}) / sum by (instance) ({rate('kvd_lookup_keys_total')})", "{{instance}}")]},
            {"title": "GET hits and misses", "unit": "ops", "w": 6, "targets": [
                (rate("kvd_hits_total"), "hits {{instance}}"), (rate("kvd_misses_total"), "misses {{instance}}")]},
            {"title": "Arena", "unit": "bytes", "w": 8, "targets": [
                (f"kvd_arena_used_bytes{{{K}}}", "used {{instance}}"),
                (f"kvd_arena_capacity_bytes{{{K}}}", "capacity {{instance}}")]},
            {"title": "Chunks in RAM by retention", "w": 8, "targets": [(f"kvd_chunks_by_class{{{K}}}", "{{retention}}")]},
            {"title": "Stored and served bytes", "unit": "Bps", "w": 8, "targets": [
                (rate("kvd_put_bytes_total"), "put {{instance}}"), (rate("kvd_get_bytes_total"), "get {{instance}}")]},
        ],
    ),
    (
        "Tiers",
        [
            {"title": "Hits by tier", "unit": "ops", "w": 8, "targets": [(rate("kvd_tier_hits_total"), "{{tier}}")]},
            {"title": "Tier fill", "unit": "percentunit", "w": 8, "targets": [
                (f"kvd_tier_used_bytes{{{K}}} / (kvd_tier_capacity_bytes{{{K}}} > 0)", "{{tier}}")]},
            {"title": "Tier read and write", "unit": "Bps", "w": 8, "targets": [
                (rate("kvd_tier_read_bytes_total"), "read {{tier}}"),
                (rate("kvd_tier_written_bytes_total"), "written {{tier}}")]},
            {"title": "Long tier queue", "w": 8, "targets": [
                (f'kvd_tier_queued_writes{{tier="long",{K}}}', "queued"),
                (f'kvd_tier_backlog{{tier="long",{K}}}', "backlog"),
                (f'kvd_tier_unpersisted_chunks{{tier="long",{K}}}', "unpersisted")]},
            {"title": "Long tier errors and deferred writes", "w": 8, "targets": [
                (increase("kvd_tier_failed_writes_total"), "failed writes"),
                (increase("kvd_tier_failed_reads_total"), "failed reads"),
                (increase("kvd_tier_dropped_writes_total"), "deferred to the backlog"),
                (increase("kvd_tier_evicted_unwritten_total"), "lost (left RAM unwritten)")]},
            {"title": "Long tier state (1: ready)", "w": 8, "targets": [
                (f'kvd_tier_info{{tier="long",state="ready",{K}}} or (kvd_tier_info{{tier="long",{K}}} * 0)',
                 "{{instance}} {{backend}} {{state}}"),
                (f'kvd_tier_connected{{tier="long",{K}}}', "connected {{instance}}"),
                (increase("kvd_tier_timeouts_total", f'tier="long",{K}'), "timeouts {{instance}}")]},
            {"title": "Checksum failures", "w": 8, "targets": [(increase("kvd_corrupt_chunks_total"), "{{instance}}")],
             "thresholds": RED_FROM_1},
        ],
    ),
    (
        "Data path",
        [
            {"title": "Clients by data path", "w": 8, "targets": [(f"sum by (data_path) (kvd_clients{{{K}}}) or vector(0)", "{{data_path}}")]},
            {"title": "Clients on a fallback path", "w": 8, "targets": [
                (f"sum by (name, role, data_path) (kvd_clients_fallback{{{K}}}) or vector(0)",
                 "{{name}} {{role}} {{data_path}}")],
             "thresholds": RED_FROM_1},
            {"title": "Engine data path", "w": 8, "targets": [
                (f"vllm:kvd_data_path_info{{{V}}} == 1", "{{model_name}} {{data_path}}"),
                (f"vllm:kvd_data_path_fallback{{{V}}}", "{{model_name}} fallback")]},
        ],
    ),
    (
        "Connector (vLLM's endpoint)",
        [
            {"title": "kvd hit tokens by tier", "unit": "short", "w": 8, "targets": [
                (f"sum by (tier) ({rate('vllm:kvd_hit_tokens_total', V)})", "{{tier}}")]},
            {"title": "Chunks loaded and saved", "unit": "ops", "w": 8, "targets": [
                (f"sum({rate('vllm:kvd_loaded_chunks_total', V)})", "loaded"),
                (f"sum({rate('vllm:kvd_saved_chunks_total', V)})", "saved")]},
            {"title": "Load and store bandwidth", "unit": "Bps", "w": 8, "targets": [
                (f"sum({rate('vllm:kv_offload_load_bytes_total', V)})", "load"),
                (f"sum({rate('vllm:kv_offload_store_bytes_total', V)})", "store")]},
            {"title": "Load and save step latency (p50, p99)", "unit": "s", "w": 8, "targets": [
                (quantile(q, f"vllm:kvd_{step}_duration_seconds"), f"{step} p{round(q * 100)}")
                for step in ("load", "save") for q in (0.5, 0.99)]},
            {"title": "Bytes per load and save step (p50)", "unit": "bytes", "w": 8, "targets": [
                (quantile(0.5, "vllm:kv_offload_load_size"), "load"),
                (quantile(0.5, "vllm:kv_offload_store_size"), "store")]},
            {"title": "Failed loads and dropped saves", "w": 8, "targets": [
                (f"sum by (reason) ({increase('vllm:kvd_failed_loads_total', V)})", "failed load: {{reason}}"),
                (f"sum by (reason) ({increase('vllm:kvd_dropped_saves_total', V)})", "dropped save: {{reason}}"),
                (f"sum({increase('vllm:kvd_lookup_errors_total', V)})", "lookup errors")]},
        ],
    ),
    (
        "vLLM prefix cache",
        [
            {"title": "Prefix cache hit ratio (GPU)", "unit": "percentunit", "w": 6, "targets": [
                (f"sum({rate('vllm:prefix_cache_hits_total', V)}) / sum({rate('vllm:prefix_cache_queries_total', V)})", "local")]},
            {"title": "External prefix cache hit ratio (kvd)", "unit": "percentunit", "w": 6, "targets": [
                (f"sum({rate('vllm:external_prefix_cache_hits_total', V)}) / sum({rate('vllm:external_prefix_cache_queries_total', V)})", "external")]},
            {"title": "Cached prompt tokens by source (vLLM 0.32+)", "unit": "short", "w": 6, "targets": [
                (f"sum by (source) ({rate('vllm:prompt_tokens_cached_by_source_total', V)})", "{{source}}")]},
            {"title": "GPU KV cache usage", "unit": "percentunit", "w": 6, "targets": [
                (f"vllm:kv_cache_usage_perc{{{V}}}", "{{model_name}} {{engine}}")]},
        ],
    ),
]  # fmt: skip


def panel(spec: dict[str, Any], pid: int, x: int, y: int) -> dict[str, Any]:
    kind = spec.get("type", "timeseries")
    defaults: dict[str, Any] = {"unit": spec.get("unit", "short")}
    if "thresholds" in spec:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": c, "value": v} for c, v in spec["thresholds"]],
        }
    out: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": spec["title"],
        "datasource": DS,
        "gridPos": {"h": 4 if kind == "stat" else 8, "w": spec["w"], "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if kind == "timeseries" else {},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(spec["targets"])
        ],
    }
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, specs in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for spec in specs:
            p = panel(spec, pid, x, y)
            if x + spec["w"] > 24:
                y, x = y + row_h, 0
                p["gridPos"].update(x=0, y=y)
                row_h = 0
            panels.append(p)
            pid, x, row_h = pid + 1, x + spec["w"], max(row_h, p["gridPos"]["h"])
        y += row_h
    return {
        "title": "infera-kvd",
        "uid": "infera-kvd",
        "description": "The kvd daemon, its tiers and data paths, and InferaKvdConnector inside vLLM, beside vLLM's prefix-cache panels.",
        "tags": ["infera-kvd", "vllm", "kv-cache"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}},
                variable("instance", "kvd instance", "label_values(kvd_build_info, instance)"),
                variable("model_name", "vLLM model", "label_values(vllm:kvd_lookups_total, model_name)"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }  # fmt: skip


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT}")
