"""The STATS snapshot: counters of the store, the server, each client and each tier."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from infera import __version__
from infera.keyrules import fingerprint_conflicts
from infera.kvd import protocol as P
from infera.units import format_size

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.conn import Client
    from infera.kvd.store import Store
    from infera.kvd.tiers.base import LongTier

# Clients listed in STATS. With every HELLO and REPORT field at its bound (infera.kvd.protocol) an
# entry is at most ~70 KB of msgpack, so 64 of them make a reply of at most ~4.5 MB: well under the
# 16 MiB frame cap, and cheap enough to encode on the loop for every STATS.
STATS_MAX_CLIENTS = 64


class StatsSource(Protocol):
    """What the snapshot reads of the daemon (the server provides it)."""

    @property
    def cfg(self) -> DaemonConfig: ...
    @property
    def store(self) -> Store | None: ...
    @property
    def long(self) -> LongTier | None: ...
    @property
    def clients(self) -> Mapping[int, Client]: ...
    @property
    def started(self) -> float: ...
    @property
    def connections_total(self) -> int: ...
    @property
    def refused_total(self) -> int: ...
    @property
    def protocol_errors_total(self) -> int: ...
    def netio_stats(self) -> dict[str, Any]: ...


def build_snapshot(server: StatsSource) -> dict[str, Any]:
    """Everything ``kvd stat --json`` prints; refreshed by the loop once a second and on STATS."""
    assert server.store is not None
    snap = server.store.snapshot()
    hello = [c for c in server.clients.values() if c.hello]
    # Oldest first (engines are long-lived); a bounded list keeps every reply under the frame cap.
    now = server.store.clock()
    for c in hello:
        c.budget.expire(now)  # (holds that ended stop counting in pinned_bytes)
    clients = [c.public() for c in hello[:STATS_MAX_CLIENTS]]
    names = sorted({c.namespace for c in hello})
    table = server.store.ns
    snap.update(server.netio_stats())
    snap.update(
        {
            "version": __version__,
            "protocol": P.PROTOCOL_VERSION,
            "pid": os.getpid(),
            "socket": server.cfg.socket,
            "uptime_s": round(time.time() - server.started, 1),
            "connections_total": server.connections_total,
            "refused_total": server.refused_total,
            "protocol_errors_total": server.protocol_errors_total,
            "clients_connected": len(hello),
            "clients": clients,
            "clients_omitted": len(hello) - len(clients),
            "namespaces": names[:STATS_MAX_CLIENTS],
            "namespaces_omitted": max(0, len(names) - STATS_MAX_CLIENTS),
            "namespace_ids_in_use": len(table),
            "namespace_ids_freed_total": table.freed_total,
            "namespace_refused_total": table.refused_total,
            "long_backend": server.cfg.long_backend,
            "warnings": hash_warnings(clients) + quota_warnings(clients),
        }
    )
    long = server.long.stats() if server.long is not None else None
    # hits_total counts every GET hit; a hit the long tier served (promotion) is not a RAM hit.
    long_hits = int(long.get("hits", 0)) if long else 0
    tiers: dict[str, Any] = {
        "ram": {
            "hits": snap["hits_total"] - long_hits,
            "misses": snap["misses_total"] + long_hits,
            "bytes_read": snap["bytes_out_total"],
            "bytes_written": snap["bytes_in_total"],
            "chunks": snap["chunks"],
            "bytes_used": snap["arena_bytes_used"],
            "capacity": snap["arena_bytes_capacity"],
            "evictions": snap["evictions_total"],
        }
    }
    if long is not None:
        tiers["long"] = long
    snap["tiers"] = tiers
    return snap


def hash_warnings(clients: list[dict[str, Any]]) -> list[str]:
    """Warn when clients serving the same model declare different hash settings (their keys never meet).
    Each process is named once: an engine's scheduler and worker halves may share one."""
    out = []
    for model, fps in fingerprint_conflicts(clients):
        parts = "; ".join(
            f"{fp}: {', '.join(dict.fromkeys(_pid(c) for c in who))}" for fp, who in fps.items()
        )
        out.append(
            f"engines of model {model} disagree on hash settings, so they never share chunks ({parts})"
        )
    return out


def quota_warnings(clients: list[dict[str, Any]]) -> list[str]:
    """Warn about clients at their pin budget (``--client-quota``): refused writes, or leases past it."""
    out = []
    for c in clients:
        quota, pinned, refused = c.get("quota_bytes"), c.get("pinned_bytes", 0), c.get("quota_refused", 0)
        if quota is None or not (refused or pinned > quota):
            continue
        who = f"client {c.get('name') or '?'} ({_pid(c)})"
        held = f"it pins {format_size(pinned)} of its {format_size(quota)} (--client-quota)"
        if pinned > quota:
            out.append(f"{who} leases more than its pin quota, a lease leak?: {held}")
        else:
            out.append(f"{who} had {refused} PUT keys refused for its pin quota: {held}")
    return out


def _pid(client: Mapping[str, Any]) -> str:
    return f"pid {client.get('pid')}"
