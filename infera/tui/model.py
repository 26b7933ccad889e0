"""Rates and history derived from successive STATS replies, and the client-table order.

The daemon only publishes monotonically growing counters; a rate is the difference between two
replies divided by the time between them. A daemon that restarted (another pid, a smaller uptime,
or a counter that went down) starts a fresh baseline instead of producing a negative rate.
Nothing here imports Textual, so tests and the render benchmark can use it on its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infera.display import count, number

# series name -> (STATS counter, label shown on screen, whether the value is a byte count)
SERIES: dict[str, tuple[str, str, bool]] = {
    "gets": ("gets_total", "gets/s", False),
    "sets": ("sets_total", "sets/s", False),
    "read": ("bytes_out_total", "read/s", True),
    "written": ("bytes_in_total", "written/s", True),
}

DEFAULT_WINDOW_S = 300.0


@dataclass(frozen=True)
class Sample:
    """One set of per-second rates, computed from two STATS replies ``dt`` seconds apart."""

    rates: dict[str, float]
    dt: float
    recent_hit_ratio: float | None


def _counter(stats: Mapping[str, Any], key: str) -> float:
    value = number(stats.get(key, 0))
    return float(value) if value is not None else 0.0


class History:
    """Keeps the last ``maxlen`` rate samples of each series in :data:`SERIES`.

    ``add(stats, now)`` takes a STATS reply and the monotonic time it arrived; it returns the new
    :class:`Sample`, or None when there is no usable baseline yet (first reply, or a restart). A
    restart also empties the series: the sparklines and peaks show only the running daemon.
    """

    def __init__(self, maxlen: int) -> None:
        self.maxlen = max(2, int(maxlen))
        self.series: dict[str, deque[float]] = {name: deque(maxlen=self.maxlen) for name in SERIES}
        self.latest: Sample | None = None
        self.restarts = 0
        self._prev: Mapping[str, Any] | None = None
        self._prev_at = 0.0

    @classmethod
    def for_window(cls, interval: float, window_s: float = DEFAULT_WINDOW_S) -> History:
        """A history long enough to cover ``window_s`` seconds at one sample per ``interval``."""
        return cls(round(window_s / max(interval, 0.01)))

    def _restarted(self, prev: Mapping[str, Any], stats: Mapping[str, Any]) -> bool:
        if prev.get("pid") != stats.get("pid"):
            return True
        if _counter(stats, "uptime_s") < _counter(prev, "uptime_s"):
            return True
        keys = [c for c, _l, _b in SERIES.values()] + ["hits_total", "misses_total"]
        return any(_counter(stats, k) < _counter(prev, k) for k in keys)

    def add(self, stats: Mapping[str, Any], now: float) -> Sample | None:
        prev, prev_at = self._prev, self._prev_at
        self._prev, self._prev_at = stats, now
        if prev is None:
            return None
        if self._restarted(prev, stats):  # another daemon: its history starts over (sparklines, peaks)
            self.restarts += 1
            self.latest = None
            for series in self.series.values():
                series.clear()
            return None
        dt = now - prev_at
        if dt <= 0:
            return None
        rates = {}
        for name, (counter, _label, _bytes) in SERIES.items():
            rates[name] = (_counter(stats, counter) - _counter(prev, counter)) / dt
            self.series[name].append(rates[name])
        d_hits = _counter(stats, "hits_total") - _counter(prev, "hits_total")
        d_misses = _counter(stats, "misses_total") - _counter(prev, "misses_total")
        recent = d_hits / (d_hits + d_misses) if d_hits + d_misses > 0 else None
        self.latest = Sample(rates, dt, recent)
        return self.latest

    def span_s(self, interval: float) -> float:
        """Seconds of history the sparklines can show when full (at one point per ``interval``)."""
        return self.maxlen * interval

    def extend(self, name: str, values: Iterable[float]) -> None:
        """Append raw values to one series (used to pre-fill history in benchmarks)."""
        self.series[name].extend(values)


# sort name -> function giving a client row's sort key; `s` cycles through them in this order
SORTS: dict[str, Any] = {
    "pid": lambda c: (count(c.get("pid")), count(c.get("id"))),
    "name": lambda c: (str(c.get("name") or ""), count(c.get("pid"))),
    "role": lambda c: (str(c.get("role") or ""), count(c.get("pid"))),
    "namespace": lambda c: (str(c.get("namespace") or ""), count(c.get("pid"))),
    "data path": lambda c: (not c.get("fallback"), str(c.get("data_path") or ""), count(c.get("pid"))),
    "requests": lambda c: (-count(c.get("requests")), count(c.get("pid"))),
    "pinned": lambda c: (-count(c.get("pinned_bytes")), count(c.get("pid")), count(c.get("id"))),
}
SORT_ORDER = tuple(SORTS)


def next_sort(current: str) -> str:
    i = SORT_ORDER.index(current) if current in SORT_ORDER else -1
    return SORT_ORDER[(i + 1) % len(SORT_ORDER)]


def sort_clients(clients: Iterable[Mapping[str, Any]], by: str) -> list[Mapping[str, Any]]:
    """Clients in table order for sort ``by`` (fallback rows first under ``data path``)."""
    return sorted(clients, key=SORTS.get(by, SORTS["pid"]))


def ratio(hits: Any, misses: Any) -> float | None:
    """hits / (hits + misses), or None when there were no lookups."""
    h, m = count(hits), count(misses)
    return h / (h + m) if h + m else None


def fill(used: Any, capacity: Any) -> float | None:
    """used / capacity clamped to [0, 1], or None when the capacity is unknown."""
    u, c = count(used), count(capacity)
    if c <= 0:
        return None
    return min(1.0, max(0.0, u / c))


def pin_state(client: Mapping[str, Any]) -> tuple[int, float | None, int] | None:
    """``(pinned bytes, share of its quota, PUT keys refused for it)`` of one client row: what the
    connection keeps from eviction under ``--client-quota``. The share is not clamped (leases can
    pass the quota) and is None without a quota; the whole is None from a daemon that predates pin
    budgets (no ``pinned_bytes`` field)."""
    if "pinned_bytes" not in client:
        return None
    pinned, quota = count(client.get("pinned_bytes")), count(client.get("quota_bytes"))
    return pinned, (pinned / quota if quota > 0 else None), count(client.get("quota_refused"))


def format_count(value: Any) -> str:
    """An exact counter with thousands separators (the screen shows counters unrounded)."""
    return f"{count(value):,}"


def format_rate(value: float, is_bytes: bool) -> str:
    from infera.units import format_size

    if is_bytes:
        return f"{format_size(value)}/s"
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= div:
            return f"{value / div:.1f}{unit}/s"
    return f"{value:.1f}/s"


def format_duration(seconds: Any) -> str:
    s = count(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {s:02d}s"
    return f"{s}s"


__all__ = [
    "SERIES",
    "SORT_ORDER",
    "History",
    "Sample",
    "fill",
    "format_count",
    "format_duration",
    "format_rate",
    "next_sort",
    "pin_state",
    "ratio",
    "sort_clients",
]
