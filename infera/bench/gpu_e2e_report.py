"""The partial-hit case, the prompt-length sweep and its plot for ``kvd bench gpu-e2e``.

* **partial hits** (``--partial``, default 1k and 4k new tokens): a multi-turn request, the
  largest prompt of the Llama timing model already cached and ``extra`` new tokens after it,
  timed as a recompute, a vLLM native CPU hit and a kvd RAM hit (each request a new suffix);
  ratios to recompute and to native;
* **sweep** (``--sweep``, opt-in): the timing model's rows at every length, as one table of
  TTFT against length per case and a PNG plot (``ttft_vs_length.png``, with matplotlib if it is
  installed; otherwise the run says so and writes the table only).

kvd rows carry the load policy the engines ran with (``INFERA_KVD_LOAD_POLICY``) and the prompt
tokens the policy recomputed instead of loading (``skipped``), so a fast row that loaded nothing
is never mistaken for a fast load.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

SWEEP_DEFAULT = "512,1024,2048,4096,8192,16384"
SWEEP_CASES = (
    "recompute",
    "native CPU hit",
    "kvd RAM hit, same engine",
    "kvd disk hit after restart",
    "kvd hit after the disk hit",
    "warm GPU prefix hit",
)


def median_ms(samples: list[dict[str, Any]], key: str = "ms") -> float | None:
    vals = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(vals) if vals else None


def policy_fields(case: str, samples: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """A row's load policy and the median of the tokens it skipped (kvd hit rows only)."""
    if not case.startswith("kvd"):
        return {"load_policy": None}
    return {"load_policy": policy, "skipped_tokens": median_ms(samples, "skipped_tokens")}


def cut_check(
    samples: list[dict[str, Any]], refs: list[dict[str, list[int]] | None], n: int
) -> dict[str, Any]:
    """For the hits the load policy cut short (fewer tokens loaded than the prompt's whole
    chunks): how many there were and how many gave vLLM's own tokens for a prefix cache cut at
    the same place (``refs[i]``: cut -> tokens, from ``gpu_e2e_engine.split_refs``). Equal
    tokens there mean the loaded head and the computed tail were right; only the split differs
    from the warm hit's."""
    cut = same = 0
    for s, ref in zip(samples, refs, strict=False):
        loaded = int(s.get("cached") or 0)
        if not s.get("skipped_tokens") or not ref:
            continue
        cut += 1
        want = ref.get(str(loaded))
        same += int(want is not None and s.get("tokens") == want)
    return {"cut_short": cut, "cut_same_as_vllm": same} if cut else {}


def partial_rows(records: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """One block per model and extra length: recompute, native and kvd TTFT and their ratios."""
    by = {(r.get("model"), r.get("role"), r.get("tokens")): r for r in records if r.get("_kind") == "RESULT"}
    out: list[dict[str, Any]] = []
    for (model, role, n), rec in by.items():
        if role != "kvd-a" or not rec.get("partial"):
            continue
        nat = by.get((model, "native", n), {})
        for extra, hits in rec["partial"].items():
            recompute = median_ms((rec.get("partial_recompute") or {}).get(extra) or [])
            native = median_ms((nat.get("partial") or {}).get(extra) or [])
            kvd = median_ms(hits)
            out.append(
                {
                    "model": model,
                    "cached_tokens": n,
                    "new_tokens": int(extra),
                    "recompute_ms": recompute,
                    "native_ms": native,
                    "kvd_ms": kvd,
                    "kvd_vs_native": kvd / native if kvd and native else None,
                    "kvd_vs_recompute": kvd / recompute if kvd and recompute else None,
                    "kvd_cached": median_ms(hits, "cached"),
                    "native_cached": median_ms((nat.get("partial") or {}).get(extra) or [], "cached"),
                    "load_policy": policy,
                    "skipped_tokens": median_ms(hits, "skipped_tokens"),
                }
            )
    return sorted(out, key=lambda r: (r["model"], r["new_tokens"]))


def sweep_table(summary: dict[str, Any], model: str) -> list[dict[str, Any]]:
    """TTFT per length for the sweep's cases: ``[{"tokens": n, case: ms, ...}, ...]``."""
    rows = []
    for block in summary.get("models", []):
        if block.get("model") != model:
            continue
        row: dict[str, Any] = {"tokens": block["tokens"]}
        for r in block["rows"]:
            if r["case"] in SWEEP_CASES:
                row[r["case"]] = r.get("ms")
        rows.append(row)
    return sorted(rows, key=lambda r: r["tokens"])


def plot(table: list[dict[str, Any]], path: Path, title: str) -> str:
    """Write TTFT against prompt length; returns what happened (the file, or why not)."""
    if len(table) < 2:
        return "no plot: the sweep needs at least two lengths"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed in this Python (results.json has the table)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["tokens"] for r in table]
    for case in SWEEP_CASES:
        ys = [r.get(case) for r in table]
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=case)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    from infera.bench.compare_plots import save_png

    save_png(fig, path, dpi=120)
    return f"plot: {path}"


def render(partial: list[dict[str, Any]], table: list[dict[str, Any]], note: str | None) -> str:
    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, int | float) else "-"

    lines: list[str] = []
    if partial:
        lines.append("partial hits (a cached prompt and new tokens after it)")
        lines.append(
            f"  {'model':<36} {'cached':>7} {'new':>6} {'recomp ms':>9} {'native ms':>9} {'kvd ms':>8} "
            f"{'kvd/nat':>7} {'kvd/rec':>7} {'skipped':>7} policy"
        )
        for r in partial:
            lines.append(
                f"  {r['model'][:36]:<36} {r['cached_tokens']:>7} {r['new_tokens']:>6} "
                f"{f(r['recompute_ms'], '9.1f')} {f(r['native_ms'], '9.1f')} {f(r['kvd_ms'], '8.1f')} "
                f"{f(r['kvd_vs_native'], '7.2f')} {f(r['kvd_vs_recompute'], '7.2f')} "
                f"{f(r['skipped_tokens'], '7.0f')} {r['load_policy']}"
            )
    if table:
        lines.append("sweep: TTFT ms against prompt length")
        lines.append("  " + f"{'tokens':>7} " + " ".join(f"{c[:14]:>14}" for c in SWEEP_CASES))
        for row in table:
            lines.append(
                f"  {row['tokens']:>7} " + " ".join(f"{f(row.get(c), '14.1f')}" for c in SWEEP_CASES)
            )
    if note:
        lines.append(note)
    return "\n".join(lines)


def render_rows(summary: dict[str, Any]) -> str:
    """The table of every model and length: TTFT per case, ratios, rates, the token check."""
    lines = []
    for block in summary["models"]:
        ceil = block.get("ceiling_h2d_gbps")
        head = f"{block['model']}, {block['tokens']} tokens"
        if ceil:
            head += f" (pinned H2D ceiling {ceil:.1f} GB/s)"
        lines.append(head)
        lines.append(
            f"  {'case':<28} {'TTFT ms':>8} {'/recomp':>8} {'/native':>8} {'GB/s>warm':>9} {'DMA GB/s':>8} "
            f"{'skipped':>7} {'policy':<6} tokens vs warm hit"
        )
        for r in block["rows"]:

            def f(v: Any, fmt: str) -> str:
                return format(v, fmt) if isinstance(v, int | float) else "-"

            match = {True: "same", False: "DIFFER", None: "-"}[r.get("tokens_match")]
            if r["case"] == "recompute" and r.get("tokens_match") is False:
                match = "differs*"
            if r.get("cut_short"):  # hits cut short: against vLLM's own hit cut at the same place
                match += f" cut {r['cut_same_as_vllm']}/{r['cut_short']}=vLLM"
            lines.append(
                f"  {r['case']:<28} {f(r['ms'], '8.1f')} {f(r['vs_recompute'], '8.2f')} "
                f"{f(r['vs_native'], '8.2f')} {f(r.get('load_gbps'), '9.1f')} {f(r.get('dma_gbps'), '8.1f')} "
                f"{f(r.get('skipped_tokens'), '7.0f')} {r.get('load_policy') or '-':<6} {match}"
            )
        if any(r.get("cut_short") for r in block["rows"]):
            lines.append(
                "  cut K/N=vLLM: of N hits the load policy cut short, K gave vLLM's own tokens for "
                "its prefix cache cut at the same place (the tail computed after it)"
            )
        if any(r["case"] == "recompute" and r.get("tokens_match") is False for r in block["rows"]):
            lines.append(
                "  * a full prefill computes the last token with other kernel shapes than a hit does; "
                "hits are checked against the warm GPU hit"
            )
        dma = [r["dma_gbps"] for r in block["rows"] if r.get("dma_gbps")]
        if dma and ceil:
            lines.append(
                f"  DMA GB/s: the worker's own load rate (CUDA events), {min(dma) / ceil:.2f} to "
                f"{max(dma) / ceil:.2f} of the ceiling; GB/s>warm: KV bytes over (TTFT - warm TTFT), "
                "above the link when the loads overlap the step's CPU work"
            )
        hma = block.get("hybrid_manager")
        if hma:
            lines.append(
                "  hybrid KV cache manager: "
                + ", ".join(f"{'on' if on else 'OFF'} for {role}" for role, on in sorted(hma.items()))
            )
        extras = [
            f"{k} {v:.1f}"
            for k, v in block.items()
            if k.endswith(("_ms", "_s")) and isinstance(v, int | float)
        ]
        if extras:
            lines.append("  " + ", ".join(extras))
    return "\n".join(lines)
