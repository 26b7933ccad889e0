"""``KVConnectorStats`` for InferaKvdConnector: what each step moved, reduced across workers.

Both halves keep running counters (they also go to the daemon, ``kvd stat``); each step vLLM asks
every connector instance for its stats, and :class:`StatsSource` answers with what changed since
the last answer, under the names of :data:`COUNTERS`:

* worker half: chunks and bytes loaded and saved, the time the loads and saves took (a sample per
  step for the histograms), loads that failed (vLLM recomputes those blocks) and saves dropped,
  by reason, plus the data path and whether it is a fallback;
* scheduler half: LOOKUPs, LOOKUPs that failed, and the prompt tokens hit, by the tier that held
  them (``ram``, ``disk``, ``distributed``); the hit tokens the load policy recomputed instead
  (``skipped_slower_tokens_<tier>``: judged slower than recompute; ``skipped_policy_tokens``:
  ``INFERA_KVD_LOAD_POLICY=never``) and the long-tier chunks it asked the daemon to prewarm.

vLLM sums the workers' payloads and the scheduler's (:meth:`KvdConnectorStats.aggregate`), sends
them to the API-server process as a plain dict, rebuilds them there with
``InferaKvdConnector.build_kv_connector_stats`` and prints :meth:`~KvdConnectorStats.reduce` as its
periodic ``KV Transfer metrics: ...`` line; the same dict feeds the Prometheus metrics
(:mod:`infera.engine.vllm.promstats`). The payload holds only str keys, numbers and lists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from infera.engine.vllm.scheduler.loadcost import TIERS

# the long tier's backend (HELLO's long_tier) -> the tier name in stats and metrics
LONG_TIER_KIND = {"disk": "disk", "mooncake": "distributed", "lmcache": "distributed"}
LOAD_FAILURES = ("missing", "bad_chunk", "unavailable")
SAVE_DROPS = ("full", "too_large", "quota", "unavailable", "error")

COUNTERS = (
    "loaded_chunks",
    "loaded_bytes",
    "load_seconds",
    "saved_chunks",
    "saved_bytes",
    "save_seconds",
    "lookups",
    "lookup_errors",
    *(f"hit_tokens_{t}" for t in TIERS),
    *(f"skipped_slower_tokens_{t}" for t in TIERS),
    "skipped_policy_tokens",
    "prewarmed_chunks",
    *(f"failed_loads_{w}" for w in LOAD_FAILURES),
    *(f"dropped_saves_{w}" for w in SAVE_DROPS),
)
SAMPLES = ("load_seconds", "load_bytes", "save_seconds", "save_bytes")  # one per load or save step

# the worker half's running counters -> stats counters (a counter may feed several)
WORKER_COUNTERS: dict[str, tuple[str, float]] = {
    "load_chunks": ("loaded_chunks", 1),
    "load_direct_chunks": ("loaded_chunks", 1),
    "load_bytes": ("loaded_bytes", 1),
    "load_direct_bytes": ("loaded_bytes", 1),
    "save_chunks": ("saved_chunks", 1),
    "save_bytes": ("saved_bytes", 1),
    "load_failed_missing": ("failed_loads_missing", 1),
    "load_failed_bad_chunk": ("failed_loads_bad_chunk", 1),
    "load_failed_unavailable": ("failed_loads_unavailable", 1),
    "save_full": ("dropped_saves_full", 1),
    "save_too_large": ("dropped_saves_too_large", 1),
    "save_quota": ("dropped_saves_quota", 1),
    "save_skipped_unavailable": ("dropped_saves_unavailable", 1),
    "save_errors": ("dropped_saves_error", 1),
}
SCHEDULER_COUNTERS: dict[str, tuple[str, float]] = {
    "lookups": ("lookups", 1),
    "lookup_errors": ("lookup_errors", 1),
    **{f"hit_tokens_{t}": (f"hit_tokens_{t}", 1) for t in TIERS},
    # the load policy's skips: prompt tokens a hit held that were recomputed instead
    **{f"load_skipped_slower_tokens_{t}": (f"skipped_slower_tokens_{t}", 1) for t in TIERS},
    "load_skipped_policy_tokens": ("skipped_policy_tokens", 1),
    "prewarm_chunks": ("prewarmed_chunks", 1),
}


@dataclass
class KvdConnectorStats(KVConnectorStats):
    """``data`` = ``{"counters": {name: n}, "samples": {name: [x, ...]}, "path": {...}}``; ``path``
    (``data_path``, ``fallback``) comes from the workers and is absent when it did not change."""

    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data.setdefault("counters", {})
        self.data.setdefault("samples", {})

    def reset(self) -> None:
        self.data = {"counters": {}, "samples": {}}

    def add(self, name: str, value: float) -> None:
        if value:
            c = self.data["counters"]
            c[name] = c.get(name, 0) + value

    def sample(self, name: str, value: float) -> None:
        self.data["samples"].setdefault(name, []).append(value)

    def aggregate(self, other: KVConnectorStats) -> KvdConnectorStats:
        data = getattr(other, "data", None) or {}
        for name, value in data.get("counters", {}).items():
            self.add(name, value)
        for name, values in data.get("samples", {}).items():
            self.data["samples"].setdefault(name, []).extend(values)
        theirs = data.get("path")
        if theirs:
            mine = self.data.get("path")
            if not mine:
                self.data["path"] = dict(theirs)
            else:
                paths = sorted(set(mine["data_path"].split(",")) | set(theirs["data_path"].split(",")))
                self.data["path"] = {
                    "data_path": ",".join(paths),
                    "fallback": max(int(mine["fallback"]), int(theirs["fallback"])),
                }
        return self

    def is_empty(self) -> bool:
        """Nothing moved (a path-only payload still reaches Prometheus, but prints no line)."""
        return not self.data["counters"] and not any(self.data["samples"].values())

    def reduce(self) -> dict[str, Any]:
        """The ``KV Transfer metrics`` line: totals of the interval, average step times."""
        c = self.data["counters"]
        s = self.data["samples"]

        def avg_ms(name: str) -> float:
            xs = s.get(name) or []
            return round(1000 * sum(xs) / len(xs), 3) if xs else 0.0

        out: dict[str, Any] = {
            "loaded_chunks": c.get("loaded_chunks", 0),
            "loaded_bytes": c.get("loaded_bytes", 0),
            "load_avg_ms": avg_ms("load_seconds"),
            "saved_chunks": c.get("saved_chunks", 0),
            "saved_bytes": c.get("saved_bytes", 0),
            "save_avg_ms": avg_ms("save_seconds"),
        }
        for t in TIERS:
            out[f"hit_tokens_{t}"] = c.get(f"hit_tokens_{t}", 0)
        for t in TIERS:
            out[f"skipped_slower_tokens_{t}"] = c.get(f"skipped_slower_tokens_{t}", 0)
        out["skipped_policy_tokens"] = c.get("skipped_policy_tokens", 0)
        out["prewarmed_chunks"] = c.get("prewarmed_chunks", 0)
        out["failed_loads"] = sum(c.get(f"failed_loads_{w}", 0) for w in LOAD_FAILURES)
        out["dropped_saves"] = sum(c.get(f"dropped_saves_{w}", 0) for w in SAVE_DROPS)
        out["lookup_errors"] = c.get("lookup_errors", 0)
        path = self.data.get("path")
        if path:
            out["data_path"] = path["data_path"]
            out["fallback"] = int(path["fallback"])
        return out


class StatsSource:
    """Turns one half's running counters into per-step :class:`KvdConnectorStats`.

    ``counters``: returns the half's running counters; ``mapping``: which of them are stats and
    under which name; ``path``: returns ``(data_path, fallback)`` (workers only), asked at most once
    a second and sent when it changed."""

    PATH_EVERY_S = 1.0

    def __init__(
        self,
        counters: Callable[[], Mapping[str, float]],
        mapping: Mapping[str, tuple[str, float]],
        path: Callable[[], tuple[str, bool]] | None = None,
    ) -> None:
        self._counters = counters
        self._mapping = mapping
        self._path = path
        self._last: dict[str, float] = {}
        self._pending = KvdConnectorStats()
        self._sent_path: tuple[str, bool] | None = None
        self._path_at = 0.0

    def timed(self, kind: str, seconds: float, moved_bytes: float) -> None:
        """One load or save step: its wall time and bytes, for the histograms."""
        self._pending.sample(f"{kind}_seconds", seconds)
        self._pending.sample(f"{kind}_bytes", moved_bytes)
        self._pending.add(f"{kind}_seconds", seconds)

    def take(self) -> KvdConnectorStats | None:
        """What changed since the last call; ``None`` when nothing did."""
        stats, self._pending = self._pending, KvdConnectorStats()
        now = self._counters()
        for key, (name, scale) in self._mapping.items():
            value = now.get(key, 0)
            delta = value - self._last.get(key, 0)
            if delta < 0:  # the half reset its counters
                delta = value
            if delta:
                stats.add(name, delta * scale)
            self._last[key] = value
        if self._path is not None:
            t = time.monotonic()
            if self._sent_path is None or t - self._path_at >= self.PATH_EVERY_S:
                self._path_at = t
                path = self._path()
                if path != self._sent_path:
                    self._sent_path = path
                    stats.data["path"] = {"data_path": path[0], "fallback": int(path[1])}
        if stats.is_empty() and "path" not in stats.data:
            return None
        return stats


def counters_of(half: Any) -> Callable[[], Mapping[str, float]]:
    return lambda: half.counters


def worker_path(half: Any) -> Callable[[], tuple[str, bool]]:
    def path() -> tuple[str, bool]:
        fields = half.report_fields()
        return str(fields.get("data_path", "none")), bool(fields.get("fallback"))

    return path


def moved(half: Any, keys: tuple[str, ...]) -> float:
    c = half.counters
    return float(sum(c.get(k, 0) for k in keys))


def timed_call(source: StatsSource | None, half: Any, kind: str, fn: Callable[[], None]) -> None:
    """Run one load or save step and record its time and bytes (nothing when it moved nothing
    and failed nothing)."""
    if source is None:
        fn()
        return
    keys = ("load_bytes", "load_direct_bytes") if kind == "load" else ("save_bytes",)
    before = moved(half, keys)
    started = time.perf_counter()
    fn()
    source.timed(kind, time.perf_counter() - started, moved(half, keys) - before)


__all__ = [
    "COUNTERS",
    "LONG_TIER_KIND",
    "SAMPLES",
    "SCHEDULER_COUNTERS",
    "TIERS",
    "WORKER_COUNTERS",
    "KvdConnectorStats",
    "StatsSource",
    "timed_call",
]
