"""Rich renderables for each part of the ``kvd top`` screen, built from one STATS reply.

Every function takes the STATS map as the daemon sent it and tolerates missing fields: only the
core counters are guaranteed, and the long tier's section grows as backends gain features, so a
field that is absent is simply not shown (never an exception), and one of an unexpected type is
shown as absent too (:mod:`infera.display`). Text that came from the daemon or its clients has its
control characters escaped. Counters are shown exactly, with thousands separators, so what is on
screen can be checked against ``kvd stat --json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text

from infera import loadreport
from infera.display import items, mapping, number, printable
from infera.tui.model import Sample, fill, format_count, format_duration, ratio
from infera.units import format_size

L4_BACKENDS = ("mooncake", "lmcache")
STATE_STYLE = {
    "ready": "bold green",
    "loading": "bold yellow",
    "degraded": "bold red",
    "disconnected": "bold red",
}
LONG_KNOWN = {
    "backend",
    "state",
    "chunks",
    "bytes_used",
    "capacity",
    "hits",
    "misses",
    "bytes_read",
    "bytes_written",
    "corrupt_chunks",
    "failed_writes",
    "dropped_writes",
    "queued_writes",
    "index_load_s",
    "index_source",
    "index_detail",
    "reconcile",
    "reconcile_s",
    "last_error",
    "evictions",
}
_EIGHTHS = " ▏▎▍▌▋▊▉"


def long_tier(stats: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tiers = mapping(stats.get("tiers"))
    long = tiers.get("long")
    return long if isinstance(long, Mapping) else None


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def bar(fraction: float | None, width: int) -> Text:
    """A horizontal fill bar ``width`` cells wide, green, then yellow past 80 %, red past 95 %."""
    if fraction is None:
        return Text("─" * width, style="dim")
    cells = fraction * width
    full = int(cells)
    part = _EIGHTHS[int((cells - full) * 8)] if full < width else ""
    style = "green" if fraction < 0.8 else "yellow" if fraction < 0.95 else "red"
    used = "█" * full + part.strip()
    out = Text(used, style=style)
    out.append("░" * (width - len(used)), style="grey50")
    return out


def status_line(
    stats: Mapping[str, Any] | None,
    socket: str,
    *,
    connected: bool,
    reason: str = "",
    paused: bool = False,
    interval: float = 1.0,
    last_seen: str = "",
) -> Text:
    """The top line: where we are looking and whether the numbers below are live."""
    out = Text()
    if paused:
        out.append(" PAUSED ", style="bold black on yellow")
        out.append(" ")
    if not connected:
        out.append(" DISCONNECTED ", style="bold white on red")
        if socket not in reason:
            out.append(f" {printable(socket)}", style="bold")
        out.append(f" {printable(reason or 'no daemon')}; retrying every {interval:g}s", style="red")
        if last_seen:
            out.append(f"; numbers below are from {last_seen}", style="red")
        return out
    out.append(" live ", style="bold black on green")
    out.append(f" {printable(socket)}", style="bold")
    if stats:
        out.append(f"  kvd {printable(stats.get('version', '?'))}  pid {printable(stats.get('pid', '?'))}")
        out.append(f"  up {format_duration(stats.get('uptime_s', 0))}")
        out.append(
            f"  clients {format_count(stats.get('clients_connected', len(items(stats.get('clients')))))}"
        )
    return out


def grid(rows: Sequence[Sequence[str | Text]], justify: str, styles: Sequence[str] = ()) -> Text:
    """Cells in columns two spaces apart, as one Text. ``justify`` has an ``l`` or ``r`` per
    column; ``styles`` gives plain-string cells a per-column style. A Rich Table would measure
    every cell on every refresh, which is most of a frame's cost; this only counts characters."""
    ncol = len(justify)
    cells = [
        [
            c if isinstance(c, Text) else Text(printable(c), style=styles[i] if i < len(styles) else "")
            for i, c in enumerate(row)
        ]
        for row in rows
    ]
    widths = [0] * ncol
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], cell.cell_len)
    out = Text()
    for r, row in enumerate(cells):
        if r:
            out.append("\n")
        for i, cell in enumerate(row):
            pad = " " * (widths[i] - cell.cell_len)
            if i:
                out.append("  ")
            if justify[i] == "r":
                out.append(pad)
            out.append_text(cell)
            if justify[i] == "l" and i < len(row) - 1:
                out.append(pad)
    return out


def cache_table(stats: Mapping[str, Any], sample: Sample | None) -> Text:
    """Hits, misses and hit ratio overall and per tier, with the main request counters."""
    dim = "dim"
    rows: list[list[str | Text]] = [["", Text("hits", dim), Text("misses", dim), Text("hit ratio", dim)]]
    hits, misses = stats.get("hits_total", 0), stats.get("misses_total", 0)
    rows.append(["all", format_count(hits), format_count(misses), Text(pct(ratio(hits, misses)), "bold")])
    tiers = mapping(stats.get("tiers"))
    for name in ("ram", "long"):
        tier = tiers.get(name)
        if isinstance(tier, Mapping):
            h, m = tier.get("hits", 0), tier.get("misses", 0)
            rows.append([name, format_count(h), format_count(m), pct(ratio(h, m))])
    recent = sample.recent_hit_ratio if sample else None
    rows.append([Text("recent", dim), "", "", Text(pct(recent), dim)])
    rows.append(["", "", "", ""])
    rows.append(
        ["gets", format_count(stats.get("gets_total", 0)), "sets", format_count(stats.get("sets_total", 0))]
    )
    found = pct(ratio(stats.get("lookup_hit_keys_total", 0), _missed_lookup_keys(stats)))
    rows.append(["lookups", format_count(stats.get("lookups_total", 0)), "keys found", found])
    rows.append(
        [
            "chunks",
            format_count(stats.get("chunks", 0)),
            "deletes",
            format_count(stats.get("deletes_total", 0)),
        ]
    )
    return grid(rows, "lrrr", ("bold",))


def _missed_lookup_keys(stats: Mapping[str, Any]) -> int:
    keys, found = stats.get("lookup_keys_total", 0), stats.get("lookup_hit_keys_total", 0)
    if isinstance(keys, int) and isinstance(found, int):
        return max(0, keys - found)
    return 0


def capacity_text(stats: Mapping[str, Any], width: int = 30) -> Text:
    """Fill bars for the RAM arena and, when there is one, the long tier."""
    out = Text()
    used, cap = stats.get("arena_bytes_used", 0), stats.get("arena_bytes_capacity", 0)
    frac = fill(used, cap)
    out.append("arena ", style="bold")
    out.append(bar(frac, width))
    out.append(f" {pct(frac):>6}  {format_size(_num(used))} of {format_size(_num(cap))}")
    long = long_tier(stats)
    if long is not None:
        lused, lcap = long.get("bytes_used", 0), long.get("capacity", 0)
        lfrac = fill(lused, lcap)
        out.append("\nlong  ", style="bold")
        out.append(bar(lfrac, width))
        total = f" of {format_size(_num(lcap))}" if fill(lused, lcap) is not None else " (no capacity limit)"
        out.append(f" {pct(lfrac):>6}  {format_size(_num(lused))}{total}")
    return out


def _num(value: Any) -> float:
    n = number(value)
    return float(n) if n is not None else 0.0


def health_table(stats: Mapping[str, Any]) -> Text:
    """Counters that mean data was lost or refused; non-zero ones that signal trouble are coloured."""
    long = long_tier(stats) or {}
    rows: list[tuple[str, Any, str]] = [
        ("evictions", stats.get("evictions_total", 0), ""),
        ("expired", stats.get("expired_total", 0), ""),
        ("puts refused", stats.get("put_rejected_total", 0), "yellow"),
    ]
    if long:
        rows += [
            ("corrupt chunks", long.get("corrupt_chunks", 0), "bold red"),
            ("failed writes", long.get("failed_writes", 0), "bold red"),
            ("dropped writes", long.get("dropped_writes", 0), "yellow"),
            ("queued writes", long.get("queued_writes", 0), ""),
        ]
    cells: list[str | Text] = []
    for label, value, alert in rows:
        cells.append(label)
        cells.append(Text(format_count(value), style=alert if alert and _num(value) > 0 else ""))
    while len(cells) % 4:
        cells.append("")
    return grid([cells[i : i + 4] for i in range(0, len(cells), 4)], "lrlr", ("bold", "", "bold"))


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return format_count(value)
    return printable(value)


def long_extras(long: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Fields of the long tier beyond the known ones (latencies, error counts, endpoints...),
    flattened one level, so backends can add numbers without a TUI change."""
    out: list[tuple[str, str]] = []
    for key in sorted(long, key=str):
        if key in LONG_KNOWN:
            continue
        value = long[key]
        if isinstance(value, Mapping):
            for sub in sorted(value, key=str):
                if not isinstance(value[sub], Mapping | list):
                    out.append((printable(f"{key}.{sub}"), _scalar(value[sub])))
        elif value is not None and not isinstance(value, list):
            out.append((printable(key), _scalar(value)))
    return out


def long_table(stats: Mapping[str, Any]) -> Text:
    """State of the long tier (L3 disk or L4 mooncake / lmcache) and whatever it reports."""
    long = long_tier(stats)
    if long is None:
        return Text("no long tier: RAM only (start kvd with --long-path or --long-backend)", style="dim")
    backend = printable(long.get("backend") or stats.get("long_backend") or "?")
    state = printable(long.get("state") or "unknown")
    level = "L4" if backend in L4_BACKENDS else "L3"
    read, written = format_size(_num(long.get("bytes_read"))), format_size(_num(long.get("bytes_written")))
    rows: list[list[str | Text]] = [
        ["backend", f"{backend} ({level})"],
        ["state", Text(state, style=STATE_STYLE.get(state, "bold"))],
        ["chunks", format_count(long.get("chunks", 0))],
        ["read / written", f"{read} / {written}"],
    ]
    load = number(long.get("index_load_s"))
    if load is not None:
        source = long.get("index_source")
        rows.append(["index load", f"{load:.2f} s" + (f" ({source})" if source else "")])
    if long.get("reconcile"):
        took = number(long.get("reconcile_s"))
        rows.append(["reconcile", str(long["reconcile"]) + (f" in {took:.2f} s" if took is not None else "")])
    if long.get("last_error"):
        rows.append(["last error", Text(printable(long["last_error"]), style="red")])
    out = grid(rows, "ll", ("bold",))
    extras = long_extras(long)
    if extras:
        half = (len(extras) + 1) // 2
        pairs = [
            [*extras[i], *(extras[i + half] if i + half < len(extras) else ("", ""))] for i in range(half)
        ]
        out.append("\n")
        out.append_text(grid(pairs, "llll", ("dim", "", "dim")))
    return out


def warning_lines(stats: Mapping[str, Any]) -> list[str]:
    """The daemon's own warnings (which name a client whose PUT keys its pin quota refused), then
    one line per client that fell back to a slower path."""
    out = [str(w) for w in items(stats.get("warnings"))]
    for c in items(stats.get("clients")):
        if isinstance(c, Mapping) and c.get("fallback"):
            out.append(
                f"pid {c.get('pid')} ({c.get('name') or '?'}) fell back to {c.get('data_path') or '?'}: "
                f"{c.get('fallback_reason') or 'no reason given'}"
            )
        counters = c.get("counters") if isinstance(c, Mapping) else None
        if isinstance(counters, Mapping) and any(
            counters.get(loadreport.SLOWER + t) for t in loadreport.TIERS
        ):
            out.append(f"pid {c.get('pid')} ({c.get('name') or '?'}) {loadreport.summary(counters)}")
    long = long_tier(stats)
    if long is not None and long.get("state") in ("degraded", "disconnected"):
        out.append(
            f"long tier {long.get('backend', '?')} is {long.get('state')}: {long.get('last_error') or ''}"
        )
    return out


def warnings_text(stats: Mapping[str, Any]) -> Text:
    lines = warning_lines(stats)
    if not lines:
        return Text("no warnings", style="green")
    out = Text()
    for i, line in enumerate(lines):
        if i:
            out.append("\n")
        out.append("⚠ ", style="bold yellow")
        out.append(printable(line))
    return out


__all__ = [
    "bar",
    "cache_table",
    "capacity_text",
    "health_table",
    "long_table",
    "status_line",
    "warning_lines",
    "warnings_text",
]
