"""The log-scale plots (PNG) of ``kvd bench scale``: index size, restart, concurrency and
namespaces against their figures in the same run; none, and no error, without matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infera.units import format_size


def plot_all(res: dict[str, Any], out: Path) -> list[Path]:
    """The log-scale plots; none (and no error) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from infera.bench.compare_plots import save_png

    out.mkdir(parents=True, exist_ok=True)
    made = []
    idx = res.get("index", [])
    if idx:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
        xs = [p["chunks"] for p in idx]
        for key, label in (
            ("lookup1000_p50_us", "LOOKUP 1,000 keys p50"),
            ("lookup1000_p99_us", "LOOKUP 1,000 keys p99"),
            ("lookup_prompt_p50_us", "LOOKUP of a prompt's 1,000 keys p50"),
            ("get_p50_us", "GET p50"),
        ):
            a1.plot(xs, [p[key] for p in idx], marker="o", label=label)
        a1.set_ylabel("µs per round trip")
        a2.plot(xs, [p["bytes_per_chunk"] for p in idx], marker="o", label="daemon bytes per chunk")
        a2.plot(
            xs,
            [p["put_evicting_us_per_chunk"] * 100 for p in idx],
            marker="s",
            label="PUT into full arena, µs/key × 100",
        )
        a2.axhline(400, color="grey", linestyle="--", linewidth=1, label="400 B target")
        for ax in (a1, a2):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("chunks indexed")
            ax.grid(which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("Index size: cost per operation (flat is O(1))")
        made.append(save_png(fig, out / "scale-index.png"))
    rs = res.get("restart", [])
    if rs:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        xs = [p["files"] for p in rs]
        ax.plot(xs, [p["scan_serving_s"] for p in rs], marker="o", label="start to serving, scan")
        ax.plot(xs, [p["scan_loaded_s"] for p in rs], marker="s", label="index complete, scan")
        ax.plot(xs, [p["serving_s"] for p in rs], marker="^", label="start to serving, snapshot")
        ax.plot(xs, [p["loaded_s"] for p in rs], marker="D", label="index complete, snapshot")
        if all(p.get("crash") for p in rs):
            ax.plot(
                xs, [p["crash"]["loaded_s"] for p in rs], marker="v", label="index complete, after kill -9"
            )
            ax.plot(
                xs,
                [p["crash"]["reconciled_s"] for p in rs],
                marker="x",
                label="reconcile done, after kill -9",
            )
        ax.axhline(1, color="grey", linestyle=":", linewidth=1)
        ax.axhline(10, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("chunk files on disk")
        ax.set_ylabel("seconds")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Restart with chunk files on disk (targets 1 s, 10 s)")
        made.append(save_png(fig, out / "scale-restart.png"))
    conc = res.get("concurrency")
    if conc:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        xs = [r["clients"] for r in conc["rows"]]
        ax.plot(
            xs, [r["kvd_gbps"] for r in conc["rows"]], marker="o", label="put+get through kvd, 1 a request"
        )
        if "step_chunks" in conc:
            ax.plot(
                xs,
                [r["kvd_step_gbps"] for r in conc["rows"]],
                marker="^",
                label=f"put+get through kvd, {conc['step_chunks']} a request",
            )
        ax.plot(xs, [r["memcpy_gbps"] for r in conc["rows"]], marker="s", label="memcpy, same bytes")
        if "step_chunks" in conc:
            ax.plot(
                xs,
                [r["memcpy_step_gbps"] for r in conc["rows"]],
                marker="s",
                linestyle="--",
                label=f"memcpy, {conc['step_chunks']} in then out",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("client processes")
        ax.set_ylabel("aggregate GB/s")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"Concurrency, {format_size(conc['chunk_bytes'])} chunks")
        made.append(save_png(fig, out / "scale-concurrency.png"))
    return made


__all__ = ["plot_all"]
