"""The whole P/D story in one run: kvd daemon, prefill and decode legs and vllm-router, as
``kvd launch pd`` writes them, then TTFT through the router and greedy output, and a table.

    python benchmarks/pd.py --model /path/or/hf-id --lengths 8192,16384 --gpu-memory-utilization 0.35
    python benchmarks/pd.py --llama8b --lengths 8192,16384 --gpu-memory-utilization 0.35   # 8B shape, dummy
    python benchmarks/pd.py --tiny --lengths 1024,8192 --phases single,cold,hit,mixed,stale \\
        --etcd-binary /usr/bin/etcd --gpu-memory-utilization 0.35                          # token check
    python benchmarks/pd.py --tiny --lengths 512,1000 --transport example   # a CPU machine

Phases (``--phases``, in this order whatever the order given):

* ``single``: one plain vLLM engine (no kvd, no P/D) serves every prompt: the reference tokens and
  TTFT. It runs first, alone on the device.
* ``cold``: the daemon and both legs (the commands of ``kvd launch pd --format json``, with the
  extra engine flags given here; the prefill leg starts first, the decode leg once the prefill
  leg serves, a precaution: vLLM sizes its KV cache from the free memory it sees while profiling),
  then the router; one fresh prompt per length through the router: a kvd miss, the prefill leg
  computes and stores it.
* ``hit``: the prefill leg's own prefix cache is emptied (``--hit-after restart``: the engine is
  restarted, daemon kept; ``reset``: ``POST /reset_prefix_cache``), the same prompts again: a kvd
  hit on the prefill leg.
* ``nokvd``: the prefill leg restarted with the transport connector alone: P/D without kvd.
* ``mixed``: the prefill leg restarted with a top-level ``kv_both`` (the trap docs/pd.md
  describes), ``kvd doctor --etcd`` run against the registrations, and the shortest prompt sent
  through the router: what the router does with such a leg.
* ``stale``: the prefill leg restarted (kvd as launched) while the router keeps running, and one
  short prompt through that router: does the router follow a restarted prefill leg?

After each restart of the prefill leg the router is restarted too (except in ``stale``): with
``--kv-connector mooncake`` the router asks the prefill leg's bootstrap server for its engine id
when it starts, and a restarted leg has a new one. Before each P/D phase the decode leg's own
prefix cache is emptied (``POST /reset_prefix_cache``; the legs run with
``VLLM_SERVER_DEV_MODE=1`` for that), so every phase moves the whole prompt's KV to decode.
Each phase starts with one short warm-up prompt that is not measured.

``--transport mooncake`` (the product: MooncakeConnector, the router's ``--kv-connector mooncake``)
needs a CUDA host. ``--transport example`` puts vLLM's ExampleConnector (a file hand-off) in the
Mooncake child's place and runs the router without ``--kv-connector mooncake``: vLLM's
MooncakeConnector cannot start without an accelerator (docs/pd.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from infera.kvd.process import DaemonProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pdkit beside this file, however it is run
from pdkit import (
    PdError,
    Proc,
    doctor,
    engine_args,
    evidence,
    launch_spec,
    llama8b_model,
    prompt,
    request,
    routable_ip,
    router_argv,
    start_etcd,
    tiny_model,
    to_example,
    top_level_both,
    without_kvd,
)

PHASES = ("single", "cold", "hit", "nokvd", "mixed", "stale")
LABELS = {
    "single": "single engine, no kvd",
    "cold": "P/D, kvd miss (cold)",
    "hit": "P/D, kvd hit on prefill",
    "nokvd": "P/D without kvd",
    "mixed": "P/D, prefill leg kv_both (mixed)",
    "stale": "P/D, router not restarted",
}


class Run:
    """The processes of one run and what they measured."""

    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a, self.work = a, work
        self.procs: list[Proc] = []
        self.rows: list[dict[str, Any]] = []
        self.notes: dict[str, Any] = {"phases": {}}
        self.t0 = time.monotonic()
        self.base = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        self.base.setdefault("VLLM_LOG_STATS_INTERVAL", "1")
        lengths = [int(x) for x in a.lengths.split(",")]
        self.prompts = {n: prompt(n, seed, a.vocab) for seed, n in enumerate(lengths, 1)}
        self.warm_seed = 100

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def proc(self, name: str, argv: list[str], env: dict[str, str], port: int) -> Proc:
        p = Proc(name, argv, env, self.work, port)
        self.procs.append(p)
        return p

    def warm(self, url: str) -> None:
        self.warm_seed += 1
        request(url, prompt(self.a.warmup_tokens, self.warm_seed, self.a.vocab), 2, timeout=600)

    def measure(self, phase: str, url: str, lengths: list[int] | None = None, timeout: float = 1800) -> None:
        for n, ids in self.prompts.items():
            if lengths is not None and n not in lengths:
                continue
            row: dict[str, Any] = {"phase": phase, "path": LABELS[phase], "tokens": n}
            try:
                row.update(request(url, ids, self.a.max_tokens, timeout=timeout))
            except (PdError, httpx.HTTPError) as exc:
                row.update(ttft=float("nan"), out=None, error=f"{type(exc).__name__}: {exc}"[:1500])
            print(f"pd bench: {row['path']}, {n} tokens: " + (
                f"TTFT {row['ttft'] * 1000:.1f} ms, tokens {row['out']}" if row.get("out") is not None
                else row["error"]), flush=True)  # fmt: skip
            self.rows.append(row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model path or Hugging Face id")
    ap.add_argument(
        "--tiny", action="store_true", help="a 2-layer Llama with random saved weights, made here"
    )
    ap.add_argument(
        "--llama8b", action="store_true", help="Llama-3.1-8B's shape, dummy weights, no tokenizer"
    )
    ap.add_argument("--lengths", default="8192,16384", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--phases", default="single,cold,hit,nokvd", help=f"of {','.join(PHASES)}")
    ap.add_argument("--hit-after", choices=("restart", "reset"), default="restart",
                    help="how the prefill leg forgets its own prefix cache before the hit phase")  # fmt: skip
    ap.add_argument("--transport", choices=("mooncake", "example"), default="mooncake")
    ap.add_argument("--transfer-protocol", choices=("tcp", "rdma"), help="Mooncake protocol (kvd launch's)")
    ap.add_argument("--gpu-memory-utilization", type=float, help="per engine (two share a GPU unless split)")
    ap.add_argument("--kv-cache-memory-bytes", type=int, help="engine KV cache size (CPU hosts)")
    ap.add_argument("--load-format", help="e.g. dummy: random weights, no download")
    ap.add_argument("--max-model-len", type=int, default=0, help="default: the longest length + 128")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--skip-tokenizer-init", action="store_true")
    ap.add_argument(
        "--prefill-devices", help="CUDA_VISIBLE_DEVICES of the prefill leg (and the single engine)"
    )
    ap.add_argument("--decode-devices", help="CUDA_VISIBLE_DEVICES of the decode leg")
    ap.add_argument("--decode-debug", action="store_true", help="the decode leg logs at DEBUG (each KV pull)")
    ap.add_argument("--max-bytes", default="16G", help="the daemon's RAM tier")
    ap.add_argument("--etcd", default="127.0.0.1:2379", help="where the legs register (no etcd is fine)")
    ap.add_argument("--etcd-binary", help="start this etcd at --etcd for the run (needed by the mixed phase)")
    ap.add_argument("--advertise-host", help="the legs' address (default: this host's routable one)")
    ap.add_argument("--router-port", type=int, default=8000)
    ap.add_argument("--python", default=sys.executable, help="the engines' and router's Python")
    ap.add_argument("--vocab", type=int, default=1000, help="token ids of the prompts stay below this")
    ap.add_argument("--warmup-tokens", type=int, default=64)
    ap.add_argument("--workdir", help="logs and the daemon socket (default: a new temporary directory)")
    ap.add_argument("--results", help="write the rows, counters and log evidence here as JSON")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--deadline", type=float, default=0, help="seconds: skip mixed/stale past this minus 150")
    a = ap.parse_args()
    phases = [p for p in PHASES if p in a.phases.split(",")]
    unknown = set(a.phases.split(",")) - set(PHASES)
    if unknown:
        sys.exit(f"pd bench: unknown phases {sorted(unknown)}; known: {','.join(PHASES)}")
    lengths = [int(x) for x in a.lengths.split(",")]
    a.max_model_len = a.max_model_len or max(lengths) + a.max_tokens + 128
    work = Path(a.workdir or tempfile.mkdtemp(prefix="pd-bench-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        a.model, a.skip_tokenizer_init, a.enforce_eager = tiny_model(work, a.max_model_len), True, True
    elif a.llama8b:
        a.model, a.skip_tokenizer_init, a.load_format = llama8b_model(work), True, a.load_format or "dummy"
    if not a.model:
        sys.exit("pd bench: --model is required (or --tiny, --llama8b)")
    run = Run(a, work)

    def on_term(signum: int, _frame: Any) -> None:
        raise PdError(f"pd bench: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        execute(run, phases)
    except PdError as exc:
        run.notes["error"] = str(exc)[-4000:]
        print(str(exc), file=sys.stderr, flush=True)
    finally:
        for p in reversed(run.procs):
            with contextlib.suppress(Exception):
                p.stop()
        report(run)
    if "error" in run.notes:
        sys.exit(1)


def execute(run: Run, phases: list[str]) -> None:
    a, work = run.a, run.work
    base = run.base
    if "single" in phases:
        single_argv = [a.python, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model]
        single_argv += ["--port", str(a.router_port + 10), *engine_args(a)]
        env = {**base, **({"CUDA_VISIBLE_DEVICES": a.prefill_devices} if a.prefill_devices else {})}
        single = run.proc("single", single_argv, env, a.router_port + 10)
        single.wait("/health", a.startup_timeout)
        run.warm(single.url)
        run.measure("single", single.url)
        run.notes["phases"]["single"] = {"ready_s": single.ready_s, "metrics": single.metrics()}
        single.stop()
    pd = [p for p in phases if p != "single"]
    if not pd:
        return
    etcd = start_etcd(a.etcd_binary, a.etcd, work) if a.etcd_binary else None
    try:
        pd_phases(run, pd)
    finally:
        if etcd is not None:
            etcd.stop()


def pd_phases(run: Run, phases: list[str]) -> None:
    a, work, base = run.a, run.work, run.base
    host, sock = a.advertise_host or routable_ip(), str(work / "kvd.sock")
    spec = launch_spec(a, host, sock)
    run.notes["spec"] = spec
    legs = {leg["name"]: leg for leg in spec["legs"]}
    d_argv = spec["daemon"]["argv"]
    at = d_argv.index("--socket")  # DaemonProcess adds --socket itself
    daemon = DaemonProcess(sock, d_argv[at + 2 :], work / "kvd.log", command=d_argv[:at]).start()
    state: dict[str, Proc] = {}

    def leg(name: str, tag: str = "", change: Any = None) -> Proc:
        spec_leg = legs[name]
        argv = spec_leg["argv"]
        if a.transport == "example":
            role = "kv_producer" if name == "prefill" else "kv_consumer"
            argv = to_example(argv, role, str(work / "handoff"))
        if change is not None:
            argv = change(argv)
        env = {**base, **spec_leg["env"], "VLLM_SERVER_DEV_MODE": "1"}
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = "8998" if name == "prefill" else "8999"
        if name == "decode" and a.decode_debug:
            env["VLLM_LOGGING_LEVEL"] = "DEBUG"
        devices = a.prefill_devices if name == "prefill" else a.decode_devices
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices
        port = int(argv[argv.index("--port") + 1])
        p = run.proc(name + tag, argv, env, port)
        p.wait("/health", a.startup_timeout)
        return p

    def router(tag: str = "") -> Proc:
        if "router" in state:
            state.pop("router").stop()
        r = run.proc(
            "router" + tag, router_argv(spec["routers"][0]["argv"], a.transport), base, a.router_port
        )
        r.wait("/health", 300)
        state["router"] = r
        return r

    def restart_prefill(tag: str, change: Any = None) -> Proc:
        state.pop("prefill").stop()
        state["prefill"] = leg("prefill", tag, change)
        return state["prefill"]

    def snapshot(phase: str, **extra: Any) -> None:
        run.notes["phases"][phase] = {
            "prefill_ready_s": state["prefill"].ready_s,
            "prefill_metrics": state["prefill"].metrics(),
            "decode_metrics": state["decode"].metrics(),
            "daemon": {k: v for k, v in daemon.stats().items() if isinstance(v, int | float)},
            **extra,
        }

    try:
        state["prefill"] = leg("prefill")
        state["decode"] = leg("decode")
        r = router()
        if "cold" in phases:
            run.warm(r.url)
            run.measure("cold", r.url)
            extra = {"doctor": doctor(a, "prefill")} if a.etcd_binary else {}
            snapshot("cold", **extra)
        if "hit" in phases:
            if a.hit_after == "restart":
                restart_prefill("-restarted")
                r = router("-2")
            elif not state["prefill"].reset_prefix_cache():
                raise PdError("pd bench: the prefill leg did not reset its prefix cache")
            state["decode"].reset_prefix_cache()
            run.warm(r.url)
            run.measure("hit", r.url)
            snapshot("hit")
        if "nokvd" in phases:
            restart_prefill("-without-kvd", without_kvd)
            r = router("-3")
            state["decode"].reset_prefix_cache()
            run.warm(r.url)
            run.measure("nokvd", r.url)
            snapshot("nokvd")
        late = a.deadline and run.elapsed() > a.deadline - 150
        if "mixed" in phases and not late:
            restart_prefill("-mixed", top_level_both)
            extra = {"doctor": doctor(a, "mixed")} if a.etcd_binary else {}
            r = router("-4")
            state["decode"].reset_prefix_cache()
            run.measure("mixed", r.url, lengths=[min(run.prompts)], timeout=180)
            snapshot("mixed", **extra)
        elif "mixed" in phases:
            run.notes["phases"]["mixed"] = {"skipped": f"past the deadline at {run.elapsed():.0f} s"}
        late = a.deadline and run.elapsed() > a.deadline - 120
        if "stale" in phases and not late:
            restart_prefill("-stale")
            state["decode"].reset_prefix_cache()
            t = time.monotonic()
            try:
                res: dict[str, Any] = request(r.url, prompt(a.warmup_tokens, 99, a.vocab), 2, timeout=60)
            except (PdError, httpx.HTTPError) as exc:
                res = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
            res["seconds"] = time.monotonic() - t
            snapshot("stale", request=res, router_log=state["router"].tail(4000))
        elif "stale" in phases:
            run.notes["phases"]["stale"] = {"skipped": f"past the deadline at {run.elapsed():.0f} s"}
    finally:
        for p in state.values():
            with contextlib.suppress(Exception):
                p.stop()
        run.notes["daemon_final"] = {k: v for k, v in daemon.stats().items() if isinstance(v, int | float)}
        daemon.stop()


def report(run: Run) -> None:
    a, rows = run.a, run.rows
    print(f"\nP/D through vllm-router: model {a.model}, transport {a.transport}, logs in {run.work}")
    print(f"{'path':34} {'tokens':>7} {'TTFT ms':>9} {'x single':>9}  greedy = single")
    single = {r["tokens"]: r for r in rows if r["phase"] == "single" and r.get("out") is not None}
    for r in rows:
        ref = single.get(r["tokens"])
        if r.get("out") is None:
            print(f"{r['path']:34} {r['tokens']:>7} {'failed':>9} {'-':>9}  {r.get('error', '')[:80]}")
            continue
        ratio = f"{r['ttft'] / ref['ttft']:.2f}" if ref else "-"
        same = "-" if ref is None else ("yes" if r["out"] == ref["out"] else "NO")
        r["same_as_single"] = same
        print(f"{r['path']:34} {r['tokens']:>7} {r['ttft'] * 1000:>9.1f} {ratio:>9}  {same}")
    keys = ("sets_total", "gets_total", "hits_total", "misses_total")
    for phase, note in run.notes["phases"].items():
        if "daemon" in note:
            print(f"daemon after {phase}: " + ", ".join(f"{k} {note['daemon'].get(k)}" for k in keys))
        for side in ("prefill_metrics", "decode_metrics"):
            if side in note:
                shown = {k: v for k, v in note[side].items() if "external" in k or "by_source" in k}
                print(f"{side.split('_')[0]} after {phase}: {shown}")
        if "doctor" in note:
            print(
                f"kvd doctor --etcd after {phase} (exit {note['doctor']['rc']}):\n{note['doctor']['stdout']}"
            )
        if "request" in note:
            print(f"stale router after a prefill restart: {note['request']}")
        if "skipped" in note:
            print(f"{phase}: skipped, {note['skipped']}")
    logs = {p.log_path.name: evidence(p.log_path) for p in run.procs}
    run.notes["evidence"] = logs
    for name, lines in logs.items():
        if lines:
            print(f"--- {name}: lines that show KV moving (or failing)")
            print("\n".join(ln[:400] for ln in lines))
    if a.results:
        Path(a.results).write_text(
            json.dumps({"args": vars(a), "rows": rows, **run.notes}, indent=1, default=str)
        )


if __name__ == "__main__":
    main()
