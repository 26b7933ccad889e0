"""The daemon's metrics in the Prometheus text exposition format: the names, and a STATS snapshot
rendered under them.

Names are the STATS names prefixed with ``kvd_``, renamed where Prometheus' naming rules want a unit
or ``_total`` (:data:`RENAMES`, the tier tables); :data:`METRICS` has the type and help line of each.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("infera.kvd.metrics")

# Names follow Prometheus' rules: a unit suffix in base units (_bytes, _seconds), counters end in
# _total, and no label takes unbounded values (no pids, no sockets, no paths). Every name the
# endpoint can serve is in METRICS with its one-line help; docs/observability.md lists them too.

# STATS key -> exposed name, where the key alone does not follow the rules
RENAMES = {
    "bytes_in_total": "put_bytes_total",
    "bytes_out_total": "get_bytes_total",
    "arena_bytes_used": "arena_used_bytes",
    "arena_bytes_capacity": "arena_capacity_bytes",
    "arena_bytes_stored": "arena_stored_bytes",
    "arena_largest_free": "arena_largest_free_bytes",
    "uptime_s": "uptime_seconds",
}
SKIPPED = {"pid", "protocol"}  # a pid is no metric; the protocol is a label of kvd_build_info

# Every numeric per-tier STATS field -> (exposed name, scale). The type and help of each name are
# in METRICS: gauges for levels, rates, settings and flags; counters (_total) only for running
# counts. A field that is not listed is not served (and logged once), so a field a tier adds has
# to be declared here; tests/obs checks every field the tiers return.
TIER_FIELDS: dict[str, tuple[str, float]] = {
    **{  # levels, settings and flags
        "chunks": ("tier_chunks", 1),
        "bytes_used": ("tier_used_bytes", 1),
        "capacity": ("tier_capacity_bytes", 1),
        "queued_writes": ("tier_queued_writes", 1),
        "backlog": ("tier_backlog", 1),
        "unpersisted": ("tier_unpersisted_chunks", 1),
        "reads_in_flight": ("tier_reads_in_flight", 1),
        "connected": ("tier_connected", 1),
        "journal_records": ("tier_journal_records", 1),
        "read_gbps": ("tier_read_rate_bytes_per_second", 1e9),
        "segment_bytes": ("tier_segment_bytes", 1),
        "deletes_supported": ("tier_deletes_supported", 1),
        "fsync": ("tier_fsync", 1),
        "index_load_s": ("tier_index_load_seconds", 1),
        "reconcile_s": ("tier_reconcile_seconds", 1),
        "read_latency_ms": ("tier_read_latency_seconds", 1e-3),
        "write_latency_ms": ("tier_write_latency_seconds", 1e-3),
        "exists_latency_ms": ("tier_exists_latency_seconds", 1e-3),
    },
    "bytes_read": ("tier_read_bytes_total", 1),
    "bytes_written": ("tier_written_bytes_total", 1),
    **{  # running counts, exposed as tier_<field>_total
        f: (f"tier_{f}_total", 1)
        for f in (
            *("hits", "misses", "evictions", "corrupt_chunks", "failed_writes", "failed_reads"),
            *("dropped_writes", "evicted_files", "evicted_unwritten", "files_written", "files_ignored"),
            *("files_other_version", "prewarmed", "promotion_no_room", "quarantined", "recovered_writes"),
            *("stale_temp_removed", "reconcile_added", "reconcile_dropped", "checkpoints_written"),
            *("write_retries", "adopted", "adopt_missing", "chunks_written", "removed", "resynced"),
            *("backpressure", "timeouts", "exists_calls", "exists_keys", "errors", "disconnects"),
            *("reconnects", "state_changes", "setup_failures"),
        )
    },
}
TIER_SKIPPED = {"latency_ms"}  # the same figure as read or write latency
_undeclared_logged: set[str] = set()

# name (without "kvd_") -> (type, help). A top-level STATS name not listed is still served, typed
# by its suffix, with a generic help line; a tier field must be declared (TIER_FIELDS).
METRICS: dict[str, tuple[str, str]] = {
    "build_info": ("gauge", "Always 1; labels: version, protocol, long_backend"),
    "start_time_seconds": ("gauge", "When the daemon started, in seconds since the epoch"),
    "uptime_seconds": ("gauge", "Seconds since the daemon started"),
    "chunks": ("gauge", "Chunks in the RAM tier"),
    "chunks_parked": ("gauge", "Chunks in use (leased, pinned or held) set aside from the eviction queues"),
    "reservations": ("gauge", "Open PUT reservations"),
    "arena_used_bytes": ("gauge", "Arena bytes in use (chunks, reservations, alignment)"),
    "arena_capacity_bytes": ("gauge", "Arena size (--max-bytes)"),
    "arena_stored_bytes": ("gauge", "Payload bytes of the chunks in RAM"),
    "arena_free_extents": ("gauge", "Free extents in the arena (fragmentation)"),
    "arena_largest_free_bytes": ("gauge", "Largest free extent in the arena"),
    "clients_connected": ("gauge", "Clients connected on the socket"),
    "clients": ("gauge", "Connected clients by name, role and data path"),
    "clients_fallback": ("gauge", "Connected clients on a fallback data path, by name, role and data path"),
    "hash_conflicts": (
        "gauge",
        "Models whose connected engines disagree on hash settings (never share chunks)",
    ),
    "warnings": ("gauge", "Warnings kvd stat shows"),
    "sets_total": ("counter", "Chunks stored (sealed) in the RAM tier"),
    "gets_total": ("counter", "Chunks asked for by GET"),
    "hits_total": ("counter", "GETs served, from RAM or the long tier"),
    "misses_total": ("counter", "GETs of chunks no tier holds"),
    "gets_direct_total": ("counter", "GETs the client reads from the long tier itself (GPU-direct)"),
    "evictions_total": ("counter", "Chunks evicted from RAM to make room"),
    "expired_total": ("counter", "Chunks dropped when their retention ran out"),
    "deletes_total": ("counter", "Chunks deleted by DELETE"),
    "lookups_total": ("counter", "LOOKUP requests"),
    "lookup_keys_total": ("counter", "Keys asked for by LOOKUP"),
    "lookup_hit_keys_total": ("counter", "Keys LOOKUP found (the hit ratio's numerator)"),
    "put_bytes_total": ("counter", "Payload bytes stored into the RAM tier"),
    "get_bytes_total": ("counter", "Payload bytes served by GET"),
    "put_rejected_total": ("counter", "PUTs refused (no room, too large or over quota)"),
    "put_rejected_full_total": ("counter", "PUTs refused because the arena was full even after eviction"),
    "put_rejected_quota_total": ("counter", "PUT keys refused for the writer's pin budget (--client-quota)"),
    "holds_refused_quota_total": (
        "counter",
        "LOOKUP holds not taken because the client's pin budget was spent (--client-quota)",
    ),
    "put_none_total": ("counter", "PUTs with retention none (not stored)"),
    "put_exists_total": ("counter", "PUTs of chunks already stored"),
    "put_busy_total": ("counter", "PUTs of chunks another writer was storing"),
    "put_rolled_back_total": ("counter", "Reservations rolled back when a batch did not fit"),
    "aborts_total": ("counter", "Reservations aborted by their writer"),
    "evict_skipped_total": ("counter", "Eviction candidates skipped (leased or held)"),
    "corrupt_chunks_total": ("counter", "Chunks that failed their checksum on read (never served)"),
    "long_unpersisted_evicted_total": (
        "counter",
        "Long-retention chunks evicted from RAM before the long tier had them",
    ),
    "connections_total": ("counter", "Socket connections accepted"),
    "refused_total": ("counter", "Socket connections refused (uid check)"),
    "protocol_errors_total": ("counter", "Malformed or unknown requests"),
    "chunks_by_class": ("gauge", "Chunks in RAM by retention class"),
    "evictions_by_class_total": ("counter", "Chunks evicted from RAM by retention class"),
    "tier_info": ("gauge", "Always 1; labels: tier, backend, state"),
    "tier_chunks": ("gauge", "Chunks the tier holds"),
    "tier_used_bytes": ("gauge", "Bytes the tier holds"),
    "tier_capacity_bytes": ("gauge", "The tier's size (0: unbounded or unknown)"),
    "tier_queued_writes": ("gauge", "Chunks waiting to be written to the long tier"),
    "tier_backlog": ("gauge", "Writes waiting for the long tier to come back"),
    "tier_unpersisted_chunks": ("gauge", "Long-retention chunks in RAM the long tier does not have yet"),
    "tier_reads_in_flight": ("gauge", "Long-tier reads running"),
    "tier_connected": ("gauge", "1 while a distributed long tier is reachable"),
    "tier_index_load_seconds": ("gauge", "How long the disk tier took to rebuild its index at start"),
    "tier_reconcile_seconds": (
        "gauge",
        "How long the disk tier's reconcile after a journal replay took (absent until it finished)",
    ),
    "tier_journal_records": ("gauge", "Disk-tier index journal records since the last checkpoint"),
    "tier_read_rate_bytes_per_second": (
        "gauge",
        "Recent read throughput of the long tier (a moving average; absent before the first read)",
    ),
    "tier_segment_bytes": (
        "gauge",
        "Memory this daemon lends to the Mooncake pool (--mooncake-segment-bytes)",
    ),
    "tier_deletes_supported": ("gauge", "1 if the distributed long tier can delete keys (lmcache: 0)"),
    "tier_fsync": ("gauge", "1 if the disk tier syncs each chunk file to disk (--fsync)"),
    "tier_read_latency_seconds": ("gauge", "Recent read latency of a distributed long tier"),
    "tier_write_latency_seconds": ("gauge", "Recent write latency of a distributed long tier"),
    "tier_exists_latency_seconds": ("gauge", "Recent exists-check latency of a distributed long tier"),
    "tier_hits_total": ("counter", "Chunks the tier served"),
    "tier_misses_total": ("counter", "Chunks asked of the tier that it did not have"),
    "tier_read_bytes_total": ("counter", "Bytes read from the tier"),
    "tier_written_bytes_total": ("counter", "Bytes written to the tier"),
    "tier_evictions_total": ("counter", "Chunks the tier evicted"),
    "tier_corrupt_chunks_total": ("counter", "Chunks read from the long tier that failed their checksum"),
    "tier_failed_writes_total": ("counter", "Long-tier writes that failed"),
    "tier_failed_reads_total": ("counter", "Long-tier reads that failed"),
    "tier_dropped_writes_total": (
        "counter",
        "Long-tier writes put off to the backlog (queue full or tier down); not a loss by itself",
    ),
    "tier_evicted_files_total": ("counter", "Chunk files the disk tier deleted to make room"),
    "tier_evicted_unwritten_total": (
        "counter",
        "Long-retention chunks evicted from RAM before the long tier had them (lost)",
    ),
    "tier_files_written_total": ("counter", "Chunk files the disk tier wrote"),
    "tier_files_ignored_total": ("counter", "Files under --long-path that are not chunk files (left alone)"),
    "tier_files_other_version_total": ("counter", "Chunk files of another format version (not served)"),
    "tier_prewarmed_total": ("counter", "Chunks PREWARM pulled from the long tier into RAM"),
    "tier_promotion_no_room_total": (
        "counter",
        "Long-tier reads that found no room in RAM (answered as misses)",
    ),
    "tier_quarantined_total": ("counter", "Damaged chunk files moved aside"),
    "tier_recovered_writes_total": ("counter", "Long-tier writes that succeeded on a retry"),
    "tier_stale_temp_removed_total": ("counter", "Temporary files of interrupted writes removed at start"),
    "tier_reconcile_added_total": (
        "counter",
        "Chunk files the reconcile after a journal replay indexed (landed, never journaled)",
    ),
    "tier_reconcile_dropped_total": (
        "counter",
        "Index entries the reconcile after a journal replay dropped (their files were gone)",
    ),
    "tier_checkpoints_written_total": ("counter", "Disk-tier index checkpoints rewritten while running"),
    "tier_write_retries_total": ("counter", "Long-tier writes retried after a failure"),
    "tier_adopted_total": (
        "counter",
        "Chunk files written by a client (GPU-direct) that the disk tier indexed",
    ),
    "tier_adopt_missing_total": (
        "counter",
        "Chunk files a client said it wrote that were missing or the wrong size",
    ),
    "tier_chunks_written_total": ("counter", "Chunks written to a distributed long tier"),
    "tier_removed_total": ("counter", "Chunks deleted from a distributed long tier"),
    "tier_resynced_total": ("counter", "Chunks re-queued for writing after a distributed tier came back"),
    "tier_backpressure_total": ("counter", "Writes a distributed tier refused for now (full, busy)"),
    "tier_timeouts_total": (
        "counter",
        "Distributed-tier calls past their deadline (reads, exists checks, stuck writes)",
    ),
    "tier_errors_total": ("counter", "Failed distributed-tier operations (any kind)"),
    "tier_disconnects_total": ("counter", "Times the distributed long tier became unreachable"),
    "tier_reconnects_total": ("counter", "Times the distributed long tier came back after being unreachable"),
    "tier_state_changes_total": ("counter", "Changes of the distributed long tier's state"),
    "tier_setup_failures_total": ("counter", "Failed attempts to connect the distributed long tier's client"),
    "tier_exists_calls_total": ("counter", "Exists checks sent to a distributed tier"),
    "tier_exists_keys_total": ("counter", "Keys asked about by those exists checks"),
    "accept_errors_total": ("counter", "Failed accepts (out of descriptors); the listener backs off 0.1-1 s"),
    "output_paused_total": (
        "counter",
        "Times a client's unread replies passed 4 MiB and its requests were left unread",
    ),
    "output_dropped_total": ("counter", "Clients dropped for unread replies (16 MiB each, 32 MiB for all)"),
    "input_budget_drops_total": (
        "counter",
        "Clients dropped because partial frames of all clients passed 32 MiB",
    ),
    "replies_too_large_total": ("counter", "Replies over the frame cap, answered with a too_large error"),
    "busy_poll_yielded_total": (
        "counter",
        "Poll-window checks that found no CPU to spare on the host (the loop slept)",
    ),
    "namespace_ids_freed_total": ("counter", "Namespace ids freed for reuse"),
    "namespace_refused_total": (
        "counter",
        "HELLOs refused because no namespace id was free or the connection had 8",
    ),
    "input_buffered_bytes": ("gauge", "Bytes of partially received frames, all clients"),
    "output_queued_bytes": ("gauge", "Bytes of replies clients have not read yet, all clients"),
    "namespace_ids_in_use": ("gauge", "Namespace ids in use (of 65,535)"),
    "clients_omitted": ("gauge", "Clients left out of the STATS client list (it lists 64)"),
    "namespaces_omitted": ("gauge", "Namespaces left out of the STATS namespace list"),
    "metrics_connections_total": ("counter", "Connections to this endpoint"),
    "metrics_requests_total": ("counter", "Requests to this endpoint"),
    "metrics_closed_timeout_total": ("counter", "Endpoint connections closed at their deadline"),
    "metrics_closed_over_cap_total": ("counter", "Endpoint connections closed to make room for a new one"),
}


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _labels(**kv: object) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kv.items()) + "}"


def _num(value: object) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


def render(stats: dict[str, Any]) -> str:
    """Render a STATS snapshot in the Prometheus text exposition format."""
    from infera.keyrules import fingerprint_conflicts

    families: dict[str, list[str]] = {}  # each family's lines stay together, as the format wants

    def metric(name: str, kind: str, value: float, labels: str = "") -> None:
        full = f"kvd_{name}"
        lines = families.get(full)
        if lines is None:
            known = METRICS.get(name)
            lines = families[full] = [
                f"# HELP {full} {known[1] if known else name.replace('_', ' ')}",
                f"# TYPE {full} {known[0] if known else kind}",
            ]
        lines.append(f"{full}{labels} {value}")

    metric(
        "build_info",
        "gauge",
        1,
        _labels(
            version=stats.get("version", ""),
            protocol=stats.get("protocol", ""),
            long_backend=stats.get("long_backend") or "none",
        ),
    )
    for key in sorted(stats):
        value = stats[key]
        if key in SKIPPED or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = RENAMES.get(key, key)
        metric(name, "counter" if name.endswith("_total") else "gauge", value)
    for cls, n in sorted(stats.get("chunks_by_class", {}).items()):
        metric("chunks_by_class", "gauge", n, _labels(retention=cls))
    for cls, n in sorted(stats.get("evictions_by_class", {}).items()):
        metric("evictions_by_class_total", "counter", n, _labels(retention=cls))
    _tiers(stats.get("tiers", {}), metric)
    _clients(stats.get("clients", []), metric)
    metric("hash_conflicts", "gauge", len(fingerprint_conflicts(stats.get("clients", []))))
    metric("warnings", "gauge", len(stats.get("warnings", [])))
    return "\n".join(line for lines in families.values() for line in lines) + "\n"


def _tiers(tiers: dict[str, Any], metric: Any) -> None:
    for tier, fields in sorted(tiers.items()):
        lab = _labels(tier=tier)
        state = fields.get("state") or "ready"
        metric(
            "tier_info", "gauge", 1, _labels(tier=tier, backend=fields.get("backend", "arena"), state=state)
        )
        for fname, raw in sorted(fields.items()):
            value = _num(raw)
            if value is None or fname in TIER_SKIPPED:
                continue
            declared = TIER_FIELDS.get(fname)
            if declared is None:
                if fname not in _undeclared_logged:
                    _undeclared_logged.add(fname)
                    log.warning(
                        "tier stats field %r is not declared in exposition.TIER_FIELDS; not served", fname
                    )
                continue
            name, scale = declared
            metric(name, METRICS[name][0], value if scale == 1 else round(value * scale, 6), lab)


def _clients(clients: list[dict[str, Any]], metric: Any) -> None:
    """Connected clients counted by (name, role, data path): bounded labels, never a pid. Each
    client's own counters are in ``kvd stat``; an engine's are on vLLM's endpoint (vllm:kvd_*)."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for c in clients:
        key = (str(c.get("name") or "-"), str(c.get("role") or "client"), str(c.get("data_path") or "none"))
        counts = groups.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += int(bool(c.get("fallback")))
    for (name, role, path), (n, fallback) in sorted(groups.items()):
        lab = _labels(name=name, role=role, data_path=path)
        metric("clients", "gauge", n, lab)
        metric("clients_fallback", "gauge", fallback, lab)
