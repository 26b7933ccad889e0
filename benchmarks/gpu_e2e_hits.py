#!/usr/bin/env python3
"""Where each timed request of a ``kvd bench gpu-e2e`` run spent its time, one line per request.

    python3 benchmarks/gpu_e2e_hits.py OUTDIR/results.json [--kvd] [--tokens 16384] [--json]

Per request: the wall time (``ms``), vLLM's split of it (``queue``: queued to scheduled, which
includes the connector's lookup; ``step``: scheduled to first token), for kvd requests the time
in the connector's scheduler hooks (``sched``: lookup, load plan, step metadata), and for kvd hits the worker's
LEASE round trips, the rest of its load hook and the DMAs' own time (CUDA events), the tokens the
load policy recomputed, and the engine threads that used the most CPU meanwhile. ``--kvd`` keeps
the kvd hits only. Runs with the standard library (the GPU machine's Python has nothing else).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

PHASES = ("store", "warm", "recompute", "hit", "cross", "disk", "after_disk")
KVD = ("hit", "cross", "disk", "after_disk", "partial")
# a layer-wise step's trace (infera/engine/vllm/worker/gpu/steptrace.py), microseconds from the
# moment its first DMAs were queued
TRACE = (
    "load_lw_traced_steps",
    "load_lw_cpu_first_wait_us",
    "load_lw_cpu_us",
    "load_lw_gpu_us",
    "load_lw_dma_begin_us",
    "load_lw_dma_end_us",
)
STEP = ("step_timed", "step_cpu_us", "step_gpu_us")  # a warm GPU hit's forward, bind to wait_for_save


def _ms(us: Any) -> str:
    return "-" if us is None else f"{us / 1000:.1f}"


def rows(results: dict[str, Any], kvd_only: bool = False, tokens: int | None = None) -> list[dict[str, Any]]:
    out = []
    for rec in results.get("records", []):
        if rec.get("_kind") != "RESULT" or (tokens and rec.get("tokens") != tokens):
            continue
        role = str(rec.get("role"))
        phases: list[tuple[str, list[Any]]] = []
        for k in PHASES:
            v = rec.get(k)
            phases.append((k, v if isinstance(v, list) else [v] if isinstance(v, dict) else []))
        for extra, hs in (rec.get("partial") or {}).items():
            phases.append((f"partial+{extra}", hs))
        for phase, hs in phases:
            if kvd_only and (role == "native" or phase.split("+")[0] not in KVD):
                continue
            for h in hs:
                out.append(
                    {
                        "model": str(rec.get("model")),
                        "tokens": rec.get("tokens"),
                        "role": role,
                        "phase": phase,
                        **{
                            k: h.get(k)
                            for k in (
                                "ms",
                                "queue_ms",
                                "step_ms",
                                "sched_us",
                                "load_lease_us",
                                "load_us",
                                "load_dma_us",
                                "skipped_tokens",
                                "busy_threads",
                                *TRACE,
                                *STEP,
                            )
                        },
                        "path": load_path(h),
                    }
                )
    return out


def load_path(hit: dict[str, Any]) -> str:
    """How the worker moved a hit: ``layers`` (layer-wise), ``whole`` (every layer before the
    forward), ``small`` (layer-wise asked, loaded whole: too little DMA to hide the per-layer
    CPU behind), ``scattered`` (layer-wise asked, loaded whole: too many runs), ``-`` (no DMA)."""
    if hit.get("load_layerwise_steps"):
        return "layers"
    if hit.get("load_layerwise_small_steps"):
        return "small"
    if hit.get("load_layerwise_scattered_steps"):
        return "scattered"
    return "whole" if hit.get("load_dma_us") else "-"


def render(table: list[dict[str, Any]]) -> str:
    head = f"{'model':<22} {'tokens':>6} {'role':<8} {'phase':<13} {'ms':>7} {'queue':>6} {'step':>7}"
    head += f" {'sched':>6} {'lease':>6} {'load':>6} {'dma':>6} {'path':>9} {'skip':>6}  busiest threads (ms)"
    lines = [head]
    for r in table:
        busy = ", ".join(f"{n} {ms:g}" for n, ms in (r["busy_threads"] or []) if ms)
        q, s = r["queue_ms"], r["step_ms"]
        lines.append(
            f"{r['model'][:22]:<22} {r['tokens']:>6} {r['role'][:8]:<8} {r['phase'][:13]:<13} "
            f"{r['ms'] or 0:>7.1f} {'-' if q is None else f'{q:.1f}':>6} {'-' if s is None else f'{s:.1f}':>7} "
            f"{_ms(r['sched_us']):>6} {_ms(r['load_lease_us']):>6} {_ms(r['load_us']):>6} {_ms(r['load_dma_us']):>6} {r['path']:>9} "
            f"{'-' if r['skipped_tokens'] is None else r['skipped_tokens']:>6}  {busy}"
        )
    return "\n".join(lines)


def render_trace(table: list[dict[str, Any]]) -> str:
    """Layer-wise hits only: where their step went, from the moment the first DMAs were queued.
    ``1st wait``: CPU until vLLM asked for the first layer; ``cpu``: until the forward was queued;
    ``gpu``: until the forward ended on the GPU; ``dma``: first DMA began .. last one ended;
    ``idle``: the DMA stream's gaps inside that window; ``after``: forward left after the last
    DMA. A kvd engine's warm GPU hits come first, their ``cpu`` and ``gpu`` from vLLM binding the
    step to its end. Empty when no hit was traced (whole-step loads, or a run before the trace)."""
    traced = [r for r in table if r.get("load_lw_traced_steps")]
    if not traced:
        return ""
    warm = [r for r in table if r.get("step_timed") and r["phase"] == "warm"]
    head = f"{'layer-wise steps':<22} {'tokens':>6} {'role':<8} {'phase':<13} {'1st wait':>8} {'cpu':>6}"
    head += f" {'gpu':>6} {'dma':>13} {'idle':>6} {'after':>6}"
    lines = [head]
    for r in warm:
        lines.append(
            f"{r['model'][:22]:<22} {r['tokens']:>6} {r['role'][:8]:<8} {r['phase'][:13]:<13} {'-':>8} "
            f"{_ms(r.get('step_cpu_us')):>6} {_ms(r.get('step_gpu_us')):>6} {'-':>13} {'-':>6} {'-':>6}"
        )
    for r in traced:
        n = r["load_lw_traced_steps"]
        g = {k: (r.get(k) or 0) / n for k in TRACE[1:]}
        span = g["load_lw_dma_end_us"] - g["load_lw_dma_begin_us"]
        idle = span - (r.get("load_dma_us") or 0) / n
        after = g["load_lw_gpu_us"] - g["load_lw_dma_end_us"]
        dma = f"{_ms(g['load_lw_dma_begin_us'])}..{_ms(g['load_lw_dma_end_us'])}"
        lines.append(
            f"{r['model'][:22]:<22} {r['tokens']:>6} {r['role'][:8]:<8} {r['phase'][:13]:<13} "
            f"{_ms(g['load_lw_cpu_first_wait_us']):>8} {_ms(g['load_lw_cpu_us']):>6} "
            f"{_ms(g['load_lw_gpu_us']):>6} {dma:>13} {_ms(idle):>6} {_ms(after):>6}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="results.json of a gpu-e2e run")
    ap.add_argument("--kvd", action="store_true", help="kvd hits only")
    ap.add_argument("--tokens", type=int, default=None, help="one prompt length only")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    try:
        with open(a.results) as fh:
            results = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"gpu_e2e_hits: cannot read {a.results}: {exc}", file=sys.stderr)
        return 2
    table = rows(results, a.kvd, a.tokens)
    if a.json:
        print(json.dumps(table, indent=1))
    else:
        trace = render_trace(rows(results, False, a.tokens))
        print(render(table) + (f"\n\n{trace}" if trace else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
