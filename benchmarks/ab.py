#!/usr/bin/env python3
"""A/B: `kvd bench arena` on this tree against an earlier revision, alternating, in one run.

    .venv/bin/python benchmarks/ab.py --base 5a80e26 [--rounds 3] [--json]

The earlier revision is checked out into a temporary git worktree; each round runs the benchmark
once from each tree (the order alternates), each side in its own process with PYTHONPATH set to
its tree, so both use the same interpreter and packages. The table gives each side's median and
the ratio this/base: put+get throughput against memcpy (higher is better), LOOKUP of 1,000 keys,
GET and PING round trips (lower is better), daemon memory per 100k indexed chunks.
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
FIGURES = (
    ("put_get_ratio", "put+get / memcpy", "higher"),
    ("put_get_ratio_no_poll", "put+get / memcpy, --busy-poll-us 0", "higher"),
    ("lookup1000_p50_us", "LOOKUP 1,000 keys p50 (µs)", "lower"),
    ("get_p50_us", "GET p50 (µs)", "lower"),
    ("ping_p50_us", "PING p50 (µs)", "lower"),
    ("daemon_bytes_per_100k_chunks", "daemon bytes / 100k chunks", "lower"),
)


def _run(tree: Path, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-c", "from infera.cli import main; main()", "bench", "arena", "--json", *args]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark failed in {tree}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout[out.stdout.index("{") :])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=3, help="runs per side (alternating)")
    ap.add_argument("--index-chunks", default="100000")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvd-ab-"))
    base_tree = tmp / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_tree), a.base], cwd=ROOT, check=True)
    runs: dict[str, list[dict[str, float]]] = {"this": [], "base": []}
    try:
        for i in range(a.rounds):
            order = [("this", ROOT), ("base", base_tree)]
            for side, tree in order if i % 2 == 0 else order[::-1]:
                print(f"round {i + 1}/{a.rounds}: {side}", file=sys.stderr, flush=True)
                runs[side].append(_run(tree, ["--index-chunks", a.index_chunks]))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    table = []
    for key, label, better in FIGURES:
        this = statistics.median(r[key] for r in runs["this"])
        base = statistics.median(r[key] for r in runs["base"])
        table.append(
            {"figure": label, "key": key, "this": this, "base": base, "ratio": this / base, "better": better}
        )
    if a.json:
        print(json.dumps({"base": a.base, "rounds": a.rounds, "figures": table}, indent=2))
        return 0
    print(f"kvd bench arena, this tree vs {a.base}, medians of {a.rounds} alternating runs each")
    print(f"{'figure':40} {'this':>12} {'base':>12} {'this/base':>10}  better")
    for row in table:
        print(
            f"{row['figure']:40} {row['this']:12.2f} {row['base']:12.2f} {row['ratio']:10.3f}  {row['better']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
