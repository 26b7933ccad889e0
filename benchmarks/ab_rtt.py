#!/usr/bin/env python3
"""Paired A/B of daemon round trips: this tree against an earlier revision, in lock step.

    .venv/bin/python benchmarks/ab_rtt.py --base 5a80e26 [--rounds 40] [--ops get,ping,...] [--json]

Whole-benchmark A/B runs (benchmarks/ab.py) compare medians taken minutes apart, and on a shared
2-core VM the minute decides more than the code: tens of microseconds move by 20-50 % between
runs. Here each side (its own daemon and client, each process with PYTHONPATH set to its tree,
same interpreter) waits for a ``go``; the two sides take turns, one batch of ``--batch`` calls
each (the order alternates per round), so both see the same load. The figure per round is the
ratio of the two batch medians; the table gives the median ratio and its range over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDE = Path(__file__).resolve().parent / "ab_rtt_side.py"
LABELS = {
    "get": "GET 4 KiB (lease, copy, release)",
    "ping": "PING",
    "lookup1000": "LOOKUP 1,000 present keys",
    "put": "PUT 4 KiB",
}


def _start(tree: Path, op: str, batch: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(
        [sys.executable, str(SIDE), op, "--batch", str(batch)],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the {op} side in {tree} did not start")
    return proc


def _batch(proc: subprocess.Popen[str]) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def paired(op: str, trees: dict[str, Path], rounds: int, batch: int) -> dict[str, float | str]:
    sides = {name: _start(tree, op, batch) for name, tree in trees.items()}
    got: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for i in range(rounds):
            for name in ("this", "base") if i % 2 == 0 else ("base", "this"):
                got[name].append(_batch(sides[name]))
    finally:
        for proc in sides.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    ratios = [t / b for t, b in zip(got["this"], got["base"], strict=True)]
    return {
        "op": op,
        "figure": LABELS[op],
        "this_us": statistics.median(got["this"]),
        "base_us": statistics.median(got["base"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=40, help="batches per side (alternating)")
    ap.add_argument("--batch", type=int, default=200, help="calls per batch")
    ap.add_argument("--ops", default=",".join(LABELS), help=f"comma-separated, of {', '.join(LABELS)}")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in LABELS]
    if bad or not ops:
        raise SystemExit(
            f"--ops: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(LABELS)}"
        )
    tmp = Path(tempfile.mkdtemp(prefix="kvd-abrtt-"))
    base_tree = tmp / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_tree), a.base], cwd=ROOT, check=True)
    rows = []
    try:
        for op in ops:
            print(f"{op}: {a.rounds} rounds of {a.batch} calls per side", file=sys.stderr, flush=True)
            rows.append(paired(op, {"this": ROOT, "base": base_tree}, a.rounds, a.batch))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps({"base": a.base, "rounds": a.rounds, "batch": a.batch, "figures": rows}, indent=2))
        return 0
    print(f"daemon round trips, this tree vs {a.base}: {a.rounds} paired rounds of {a.batch} calls per side")
    print(f"{'figure':36} {'this µs':>9} {'base µs':>9} {'this/base':>10} {'range':>13}")
    for r in rows:
        rng = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        print(f"{r['figure']:36} {r['this_us']:9.1f} {r['base_us']:9.1f} {r['ratio']:10.3f} {rng:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
