#!/usr/bin/env python3
"""Where each timed request of a ``kvd bench gpu-e2e`` run spent its time, one line per request.

    python3 benchmarks/gpu_e2e_hits.py OUTDIR/results.json [--kvd] [--tokens 16384] [--json]

Per request: the wall time (``ms``), vLLM's split of it (``queue``: queued to scheduled, which
includes the connector's lookup; ``step``: scheduled to first token), and for kvd hits the worker's
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
                                "load_lease_us",
                                "load_us",
                                "load_dma_us",
                                "skipped_tokens",
                                "busy_threads",
                            )
                        },
                        "path": load_path(h),
                    }
                )
    return out


def load_path(hit: dict[str, Any]) -> str:
    """How the worker moved a hit: ``layers`` (layer-wise), ``whole`` (every layer before the
    forward), ``scattered`` (layer-wise asked, loaded whole: too many runs), ``-`` (no DMA)."""
    if hit.get("load_layerwise_steps"):
        return "layers"
    if hit.get("load_layerwise_scattered_steps"):
        return "scattered"
    return "whole" if hit.get("load_dma_us") else "-"


def render(table: list[dict[str, Any]]) -> str:
    head = f"{'model':<22} {'tokens':>6} {'role':<8} {'phase':<13} {'ms':>7} {'queue':>6} {'step':>7}"
    head += f" {'lease':>6} {'load':>6} {'dma':>6} {'path':>9} {'skip':>6}  busiest threads (ms)"
    lines = [head]
    for r in table:
        busy = ", ".join(f"{n} {ms:g}" for n, ms in (r["busy_threads"] or []) if ms)
        q, s = r["queue_ms"], r["step_ms"]
        lines.append(
            f"{r['model'][:22]:<22} {r['tokens']:>6} {r['role'][:8]:<8} {r['phase'][:13]:<13} "
            f"{r['ms'] or 0:>7.1f} {'-' if q is None else f'{q:.1f}':>6} {'-' if s is None else f'{s:.1f}':>7} "
            f"{_ms(r['load_lease_us']):>6} {_ms(r['load_us']):>6} {_ms(r['load_dma_us']):>6} {r['path']:>9} "
            f"{'-' if r['skipped_tokens'] is None else r['skipped_tokens']:>6}  {busy}"
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
    print(json.dumps(table, indent=1) if a.json else render(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
