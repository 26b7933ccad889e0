#!/usr/bin/env python3
"""The connector's scheduler half, per request, against a real daemon: what a long prompt costs
vLLM's scheduling thread before its step can run.

    .venv-vllm032/bin/python benchmarks/sched_hooks.py [--tokens 16384] [--rounds 30] [--json]
    .venv-vllm032/bin/python benchmarks/sched_hooks.py --base 76b82d6   # A/B in one run

The prompt has the shape of a Llama-3.1-8B one on a GPU: 16-token blocks, 32-token chunks (4 MiB
of KV each), so 16k tokens are 512 chunks. A daemon on a temporary socket holds every chunk key
(64-byte payloads: the daemon's index is what is timed, not copies). Two requests alternate:

* ``warm``: vLLM's own prefix cache has all but the last block: the lookup, then the step's
  metadata (the saves planned for a prompt the daemon already holds).
* ``hit``: nothing local: lookup (with the hold a load takes), the load plan for every chunk
  (``after_alloc``), the step's metadata.

Each figure is the median over ``--rounds`` requests of the wall time in the hooks, in
microseconds. ``--base REV`` checks REV out into a temporary git worktree and runs this same file
against each tree in turn (alternating, each in its own process and with its own daemon), then
prints both medians and this/base. It runs in a vLLM venv: the scheduler half imports vLLM's
connector stats class (no engine is started).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BLOCK, CHUNK = 16, 32
KINDS = ("warm_us", "hit_us")


def _facts() -> Any:
    from infera.engine.vllm.keys import EngineFacts

    return EngineFacts(
        model="/bench/llama-8b-shape", model_type="llama", num_layers=32, total_kv_heads=8,
        kv_heads_per_rank=8, head_size=128, use_mla=False, dtype="bfloat16", kv_cache_dtype="auto",
        block_size=BLOCK, hash_block_size=BLOCK, bytes_per_token=32 * 2 * 8 * 128 * 2, tp_size=1,
        pp_size=1, hash_algo="sha256", hash_seed="fixed", vllm_version="0.26.0", platform="cuda",
    )  # fmt: skip


def _request(rid: str, tokens: int) -> Any:
    hashes = [hashlib.sha256(f"block-{i}".encode()).digest() for i in range(tokens // BLOCK)]
    return SimpleNamespace(
        request_id=rid, num_tokens=tokens, num_prompt_tokens=tokens, prompt_token_ids=None,
        block_hashes=hashes, kv_transfer_params=None,
    )  # fmt: skip


def _step(rid: str, computed: int, scheduled: int, block_ids: list[int]) -> Any:
    new = SimpleNamespace(req_id=rid, block_ids=(block_ids,), num_computed_tokens=computed)
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[])
    return SimpleNamespace(
        total_num_scheduled_tokens=scheduled, num_scheduled_tokens={rid: scheduled},
        scheduled_new_reqs=[new], scheduled_cached_reqs=cached,
    )  # fmt: skip


def measure(tokens: int, rounds: int) -> dict[str, float]:
    """This tree's medians (µs per request)."""
    from infera.engine.vllm import groups
    from infera.engine.vllm.keys import make_namespace
    from infera.engine.vllm.link import DaemonLink
    from infera.engine.vllm.scheduler.half import SchedulerHalf
    from infera.kvd.client import KvdClient
    from infera.kvd.process import DaemonProcess

    tmp = Path(tempfile.mkdtemp(prefix="kvd-sched-", dir="/tmp"))
    daemon = DaemonProcess(str(tmp / "kvd.sock"), ["--max-bytes", "256M"], tmp / "kvd.log").start()
    try:
        ns = make_namespace(_facts(), CHUNK)
        plan = groups.single_group(BLOCK, CHUNK, 32)
        first = _request("store", tokens)
        hashes = [first.block_hashes[(c + 1) * (CHUNK // BLOCK) - 1] for c in range(tokens // CHUNK)]
        keys, _ = groups.plan_keys(plan, ns.digest, hashes, 1)
        with KvdClient(str(tmp / "kvd.sock"), namespace=ns.name, name="bench-store") as c:
            c.put_many([(k, b"\x01" * 64) for k in keys])
        link = DaemonLink(
            str(tmp / "kvd.sock"),
            ns,
            role="vllm-scheduler",
            name="bench",
            model="/bench",
            want_arena=False,
            watch=False,
        )
        half = SchedulerHalf(ns, block_size=BLOCK, hash_block_size=BLOCK, ranks=1, link=link, plan=plan)
        blocks = list(range(1, tokens // BLOCK + 1))
        out: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(rounds + 2):  # two rounds of warm-up
            req = _request(f"w{i}", tokens)
            t = time.perf_counter()
            local = tokens - BLOCK
            hit, _ = half.matched_tokens(req, local)
            half.build_meta(_step(req.request_id, local, tokens - local, blocks))
            half.finished(req)
            warm = time.perf_counter() - t
            req = _request(f"h{i}", tokens)
            t = time.perf_counter()
            n, _ = half.matched_tokens(req, 0)
            half.after_alloc(req, SimpleNamespace(get_block_ids=lambda: (blocks,)), n)
            half.build_meta(_step(req.request_id, n, tokens - n, blocks))
            half.finished(req)
            took = time.perf_counter() - t
            if n != tokens - BLOCK or hit:
                raise SystemExit(f"the daemon offered {n} tokens of a {tokens}-token prompt (warm: {hit})")
            if i >= 2:
                out["warm_us"].append(warm * 1e6)
                out["hit_us"].append(took * 1e6)
        link.close()
        return {k: round(statistics.median(v), 1) for k, v in out.items()}
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _side(tree: Path, tokens: int, rounds: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--tokens",
        str(tokens),
        "--rounds",
        str(rounds),
        "--json",
    ]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the run in {tree} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ab(base: str, tokens: int, rounds: int, passes: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvd-ab-sched-"))
    tree = tmp / "base"
    got = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base],
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        raise SystemExit(f"cannot check out {base}: {got.stderr.strip()}")
    try:
        runs: dict[str, list[dict[str, float]]] = {"this": [], "base": []}
        for p in range(passes):
            for side in ("this", "base") if p % 2 == 0 else ("base", "this"):
                runs[side].append(_side(ROOT if side == "this" else tree, tokens, rounds))
                print(f"pass {p + 1}/{passes}: {side} {runs[side][-1]}", file=sys.stderr, flush=True)
        this = {k: statistics.median(r[k] for r in runs["this"]) for k in KINDS}
        was = {k: statistics.median(r[k] for r in runs["base"]) for k in KINDS}
        return {"base": base, "tokens": tokens, "this": this, "base_us": was,
                "ratio": {k: round(this[k] / was[k], 3) for k in KINDS}}  # fmt: skip
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True
        )
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--base", help="an earlier revision to compare against (A/B in one run)")
    ap.add_argument("--passes", type=int, default=4, help="with --base: runs per side, alternating")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.tokens < 2 * CHUNK or a.rounds < 1:
        raise SystemExit(f"--tokens must be at least {2 * CHUNK} and --rounds at least 1")
    if a.base:
        res = ab(a.base, a.tokens, a.rounds, max(1, a.passes))
        if a.json:
            print(json.dumps(res))
            return
        print(f"scheduler hooks per {a.tokens}-token request, µs (medians): this tree against {a.base}")
        for k in KINDS:
            print(
                f"  {k[:-3]:<5} {res['this'][k]:>9.1f} {res['base_us'][k]:>9.1f}   this/base {res['ratio'][k]:.2f}"
            )
        return
    res = measure(a.tokens, a.rounds)
    if a.json:
        print(json.dumps(res))
        return
    print(
        f"scheduler hooks per {a.tokens}-token request ({a.tokens // CHUNK} chunks), µs (medians of {a.rounds}):"
    )
    for k in KINDS:
        print(f"  {k[:-3]:<5} {res[k]:>9.1f}")


if __name__ == "__main__":
    main()
