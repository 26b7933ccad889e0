"""Tables (Markdown) and plots (PNG) of ``kvd bench compare`` results.

Every figure is printed with two ratios: against the best peer (the best non-kvd system that
produced the figure in the same run) and against the limit measured in the same run (vLLM's own
prefix cache for TTFT, memcpy for store throughput, a bare process reading one chunk file for
restart). The direction of each ratio is stated in the column header.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infera.bench.compare_ttft import PEER_ROWS
from infera.units import format_size

STORE_LABELS = {
    "kvd": "kvd (daemon arena, Unix socket)",
    "mooncake": "Mooncake Store (put_from/get_into, TCP)",
    "lmcache_server": "lmcache_server (wire protocol, TCP)",
    "redis": "Redis (SET/GET, TCP)",
    "memcpy": "memcpy, one copy (limit)",
}
RESTART_LABELS = {
    "kvd": "kvd (disk tier)",
    "redis": "Redis (RDB snapshot)",
    "lmcache_local_disk": "LMCache local disk",
    "lmcache_fs": "LMCache fs:// backend",
}
TTFT_PLOT_ROWS = (
    "recompute",
    "prefix_cache",
    "kvd_ram",
    "kvd_new_engine",
    "kvd_disk",
    "example",
    "example_restart",
    "lmcache_cpu",
)


def _x(value: float | None, digits: int = 2) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}×"


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _cell_error(row: dict[str, Any]) -> str:
    return str(row.get("error", "")).replace("|", "\\|")


def best_ttft_peer(rows: dict[str, Any], size: str) -> tuple[str, float] | None:
    """The fastest non-kvd connector row that loaded tokens at this prompt length."""
    best: tuple[str, float] | None = None
    for rid in PEER_ROWS:
        cell = rows.get(rid, {}).get("by_size", {}).get(size)
        if cell and cell["hit_tokens"] > 0 and (best is None or cell["seconds"] < best[1]):
            best = (rid, cell["seconds"])
    return best


def ttft_tables(ttft: dict[str, Any]) -> str:
    rows = ttft["rows"]
    out: list[str] = []
    for n in ttft["sizes"]:
        size = str(n)
        rec = rows["recompute"]["by_size"].get(size, {}).get("seconds")
        limit = rows["prefix_cache"]["by_size"].get(size, {}).get("seconds")
        best = best_ttft_peer(rows, size)
        peer_note = f"best peer: {rows[best[0]]['label']}" if best else "no peer loaded any tokens"
        out.append(f"**{n:,}-token prompt** ({peer_note})\n")
        out.append(
            "| system | TTFT | tokens loaded | speedup vs recompute | ÷ best peer (lower is better) "
            "| ÷ limit (lower is better) | first token = recompute's |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for row in rows.values():
            cell = row["by_size"].get(size)
            if cell is None:
                if row.get("error"):
                    failed = row.get("failed_request")
                    where = f" (request {failed})" if failed else ""
                    out.append(f"| {row['label']} | could not run{where}: {_cell_error(row)} | | | | | |")
                continue
            t = cell["seconds"]
            note = ""
            if row.get("log_errors"):
                errors = "; ".join(row["log_errors"]).replace("|", "\\|")
                note = f" (error in the engine's log: {errors})"
            same = {True: "yes", False: "**no**", None: ""}[cell["same_token"]]
            out.append(
                f"| {row['label']}{note} | {_s(t)} | {cell['hit_tokens']:,} | "
                f"{_x(rec / t if rec else None, 1)} | {_x(t / best[1] if best else None)} | "
                f"{_x(t / limit if limit else None)} | {same} |"
            )
        kvd = rows.get("kvd_ram", {}).get("by_size", {}).get(size)
        if kvd and kvd.get("load_s"):
            out.append(
                f"\nkvd's own part of its RAM hit: copying {format_size(kvd['load_bytes'])} from the arena "
                f"into the engine's KV blocks took {_s(kvd['load_s'])} "
                f"({kvd['load_bytes'] / kvd['load_s'] / 1e9:.1f} GB/s); the rest is the forward pass over the "
                f"{n - kvd['hit_tokens']:,} prompt tokens it did not load."
            )
        out.append("")
    return "\n".join(out)


def store_table(store: dict[str, Any]) -> str:
    rows = store["rows"]
    peers = [p for p in ("mooncake", "lmcache_server", "redis") if "put_gbps" in rows.get(p, {})]
    limit = rows["memcpy"]
    out = [
        f"{store['chunks']} chunks of {format_size(store['chunk_bytes'])} per round, one client thread, "
        f"one request at a time, best of {store['rounds']} rounds after a warm-up round.\n",
        "| store | put GB/s | ms per put | put ÷ best peer | put ÷ limit | get GB/s | ms per get "
        "| get ÷ best peer | get ÷ limit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    best = {op: max((rows[p][f"{op}_gbps"] for p in peers), default=None) for op in ("put", "get")}
    for name in ("kvd", "mooncake", "lmcache_server", "redis", "memcpy"):
        r = rows.get(name)
        if r is None:
            continue
        if "error" in r:
            out.append(f"| {STORE_LABELS[name]} | could not run: {r['error']} | | | | | | | |")
            continue
        cells = []
        for op in ("put", "get"):
            g = r[f"{op}_gbps"]
            ms = f"{r[f'{op}_ms']:.2f}" if f"{op}_ms" in r else ""
            b = best[op]
            cells += [f"{g:.2f}", ms, _x(g / b if b else None), _x(g / limit[f"{op}_gbps"])]
        out.append(f"| {STORE_LABELS[name]} | " + " | ".join(cells) + " |")
    out.append("\nRatios are throughput ÷ throughput: higher is better.")
    return "\n".join(out)


def _restart_best(rows: dict[str, Any], n: str) -> float | None:
    times = [
        rows[p][n]["first_hit_s"]
        for p in ("redis", "lmcache_local_disk", "lmcache_fs")
        if rows.get(p, {}).get(n, {}).get("first_hit_s") is not None
    ]
    return min(times) if times else None


def restart_table(restart: dict[str, Any]) -> str:
    rows = restart["rows"]
    counts = [str(n) for n in restart["counts"]]
    floor = restart["floor_s"]
    head = "| store | " + " | ".join(f"{int(n):,} chunks" for n in counts) + " |"
    out = [
        f"Chunks of {format_size(restart['chunk_bytes'])} on disk; time from starting the process "
        f"to the first successful read of a chunk. Limit: a bare Python process reading one chunk "
        f"file, {_s(floor)}. Each cell: time, ÷ best peer, ÷ limit (lower is better).\n",
        head,
        "|---|" + "---|" * len(counts),
    ]
    for name, label in RESTART_LABELS.items():
        cells = []
        for n in counts:
            r = rows.get(name, {}).get(n)
            if r is None:
                cells.append("not run")
            elif "error" in r:
                cells.append(f"could not run: {r['error']}")
            elif r["first_hit_s"] is None:
                cells.append(
                    f"**never**: {r['found_after_restart']:,} of {r['stored']:,} chunks found, "
                    f"{r['files_on_disk']:,} files on disk"
                )
            else:
                best = _restart_best(rows, n)
                t = r["first_hit_s"]
                extra = f"; index loaded {_s(r['ready_s'])}" if name == "kvd" else ""
                cells.append(f"{_s(t)} ({_x(t / best if best else None)}, {_x(t / floor, 0)}){extra}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _ttft_intro(t: dict[str, Any]) -> list[str]:
    """What the TTFT part ran: the model and how the engines were run."""
    mdl = t.get("model") or {}
    if not mdl:
        return []
    return [
        f"Model: random-weight Llama, {mdl['params'] / 1e6:.0f}M parameters "
        f"({format_size(mdl['weight_bytes'])} bf16), {mdl['layers']} layers, hidden "
        f"{mdl['hidden']}, {mdl['kv_heads']} KV heads × {mdl['head_dim']}; "
        f"KV {format_size(t['kv_bytes_per_token'])} per token. One engine process per "
        f"row group, `OMP_NUM_THREADS={t['threads']}`, eager mode, one output token; hits "
        f"are the best of {t['repeats']}, disk hits after a restart are each prompt's "
        f"first (cold) read. TTFT part: {t['seconds'] / 60:.1f} min.\n"
    ]


def _no_intro(part: dict[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class ReportPart:
    """One part of a compare run, as the report shows it."""

    key: str  # in the results, and the plot's file name compare-KEY.png
    heading: str
    alt: str  # the plot's alt text
    intro: Callable[[dict[str, Any]], list[str]]  # the lines before the plot
    table: Callable[[dict[str, Any]], str]  # after it


PARTS = (
    ReportPart("ttft", "TTFT on real vLLM", "TTFT", _ttft_intro, ttft_tables),
    ReportPart(
        "store",
        "Store throughput",
        "Store throughput",
        _no_intro,
        lambda st: store_table(st) + "\n",
    ),
    ReportPart(
        "restart",
        "Restart to warm",
        "Restart to warm",
        _no_intro,
        lambda rs: restart_table(rs) + "\n",
    ),
)


def _load(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def markdown(results: dict[str, Any], img: str) -> str:
    """The whole generated section: how it was run, on what, and the three parts."""
    m = results["machine"]
    mins = results["seconds"] / 60
    lines = [
        f"Command: `{results['command']}` ({results['mode']} mode), run {results['date']}, "
        f"took {mins:.0f} min.",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}. Load average (1/5/15 min) before: {_load(results['load_before'])}, "
        f"after: {_load(results['load_after'])}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".",
        "",
    ]
    for p in PARTS:
        if p.key not in results:
            continue
        part = results[p.key]
        lines.append(f"### {p.heading}\n")
        if "error" in part:
            lines.append(f"Could not run: {part['error']}\n")
            continue
        lines += p.intro(part)
        lines.append(f"![{p.alt}]({img}/compare-{p.key}.png)\n")
        lines.append(p.table(part))
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["best_ttft_peer", "markdown", "restart_table", "store_table", "ttft_tables"]
