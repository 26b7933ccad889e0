"""Draws the dashboard as a PNG from real series, for the docs, where no Grafana renderer runs.

``INFERA_OBS_DUMP=/tmp/dump.json pytest tests/vllm/test_metrics.py`` keeps every panel's query
over that test's run (a real daemon, engine and Prometheus); then
``python deploy/grafana/plot.py /tmp/dump.json docs/img/observability-dashboard.png`` lays the
panels out in the dashboard's rows, one small plot each, with the dashboard's titles and legends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

UNITS = {"bytes": ("B", 1), "Bps": ("B/s", 1), "s": ("s", 1), "ms": ("ms", 1), "percentunit": ("%", 100)}


def main(src: str, dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dump: dict[str, Any] = json.loads(Path(src).read_text())
    panels = [p for p in dump["panels"] if "row" not in p and p["type"] != "stat"]
    stats = [p for p in dump["panels"] if p.get("type") == "stat"]
    cols = 4
    rows = 1 + -(-len(panels) // cols)
    fig = plt.figure(figsize=(cols * 4.2, rows * 2.6), facecolor="#111217")
    t0 = dump["start"]
    # the stat panels, as one line of big numbers
    ax = fig.add_subplot(rows, 1, 1)
    ax.set_axis_off()
    for i, p in enumerate(stats):
        vals = [s["values"][-1][1] for s in p["series"] if s["values"]]
        text = f"{vals[0]:g}" if vals else "-"
        ax.text(
            i / max(1, len(stats)) + 0.02, 0.55, text, color="#73bf69", fontsize=22, transform=ax.transAxes
        )
        ax.text(
            i / max(1, len(stats)) + 0.02,
            0.15,
            p["title"],
            color="#ccccdc",
            fontsize=10,
            transform=ax.transAxes,
        )
    for i, p in enumerate(panels):
        ax = fig.add_subplot(rows, cols, cols + i + 1, facecolor="#181b1f")
        unit, scale = UNITS.get(p.get("unit", ""), ("", 1))
        for s in p["series"]:
            xs = [v[0] - t0 for v in s["values"]]
            ys = [v[1] * scale for v in s["values"]]
            ax.plot(xs, ys, linewidth=1.4, label=s["legend"][:28])
        ax.set_title(p["title"], color="#ccccdc", fontsize=9, loc="left")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        if unit:
            ax.set_ylabel(unit, color="#8e8e8e", fontsize=7)
        if p["series"]:
            ax.legend(fontsize=6, loc="upper left", frameon=False, labelcolor="#ccccdc")
        else:
            ax.text(0.5, 0.5, "no data", color="#8e8e8e", ha="center", transform=ax.transAxes)
    fig.suptitle(
        "infera-kvd dashboard (deploy/grafana/kvd.json), drawn from a real run: seconds since the start",
        color="#ccccdc",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(dst, dpi=80, facecolor=fig.get_facecolor())
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
