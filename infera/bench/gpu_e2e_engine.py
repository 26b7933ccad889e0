"""One engine process of ``kvd bench gpu-e2e`` (runs in a Python that has vLLM).

``python -m infera.bench.gpu_e2e_engine SPEC.json ROLE`` with ROLE one of:

* ``native``: vLLM's own ``OffloadingConnector`` (CPU offload). Per prompt length: the cold
  prefill that stores the prompt, then ``repeat`` CPU hits (GPU prefix cache reset before each),
  then ``repeat`` warm GPU prefix hits.
* ``kvd-a``: ``InferaKvdConnector``. ``repeat`` recomputes (retention ``none``, cache reset),
  the store of the main prompt and of ``repeat`` disk prompts, then ``repeat`` kvd RAM hits
  (cache reset before each) and ``repeat`` warm GPU hits.
* ``kvd-b``: a second kvd engine started after ``kvd-a`` exited: ``repeat`` cross-engine RAM
  hits of the main prompt; then it prints ``RESTART`` and waits for ``GO`` on stdin while the
  orchestrator restarts the daemon (page cache dropped); then one disk hit per disk prompt, and
  once more each of them (``after_disk``): the RAM hit a prewarm, or the disk hit's own read,
  left in the daemon.

Partial hits (a model with ``"partial": [extra, ...]`` at size ``"partial_at"``): the main prompt
followed by ``extra`` new tokens (a new suffix per request): ``native`` and ``kvd-a`` time it once
the main prompt is stored, ``kvd-a`` also recomputes it (retention ``none``) before storing.
kvd engines run with ``INFERA_KVD_LOAD_POLICY`` from the orchestrator; each kvd hit records the
tokens the scheduler skipped as slower than recompute and the chunks it prewarmed.

A model with ``"disk": false`` (the Gemma-3 rows) is stored in RAM only and has no disk rows.

Each model of the spec (small real-weight ones for correctness, the timing ones) gets its own
``LLM``, created in turn and kept alive. Before measuring, every engine serves a 512-token prompt
twice (the second time a GPU hit) and one prompt of each length (first-shape warm-up). Time to
first token is the wall time of ``generate`` for ``max_tokens`` tokens (1 for timing models).
Prints ``RESULT {json}`` per model and phase; the orchestrator collects them.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

from infera import loadreport as R
from infera.bench.gpu_e2e_probe import (
    busiest,
    prewarmed_total,
    scheduler_counters,
    thread_cpu,
    wait_prewarmed,
    wait_stored,
    worker_counters,
)

ROLES = ("native", "kvd-a", "kvd-b")


def prompt(tag: str, n: int, vocab: int) -> list[int]:
    r = random.Random(f"{tag}-{n}")
    return [r.randrange(10, vocab - 10) for _ in range(n)]


def emit(kind: str, **fields: Any) -> None:
    print(f"{kind} " + json.dumps(fields), flush=True)


class Engine:
    def __init__(self, model: dict[str, Any], role: str, spec: dict[str, Any]) -> None:
        from vllm import LLM, SamplingParams

        self.model = model
        self.role = role
        self.spec = spec
        self.sp = SamplingParams
        kw: dict[str, Any] = dict(
            model=model["path"],
            skip_tokenizer_init=True,
            enforce_eager=not spec.get("cuda_graphs"),
            enable_prefix_caching=True,
            seed=0,
            max_model_len=model["max_model_len"],
            max_num_batched_tokens=model["max_num_batched_tokens"],
            max_num_seqs=4,
            disable_log_stats=False,
        )
        if model.get("load_format"):
            kw["load_format"] = model["load_format"]
        if spec.get("gpu_memory_utilization"):
            kw["gpu_memory_utilization"] = model.get("gpu_memory_utilization", spec["gpu_memory_utilization"])
        if spec.get("kv_cache_bytes"):
            kw["kv_cache_memory_bytes"] = int(spec["kv_cache_bytes"])
        if role == "native":
            kw["kv_transfer_config"] = {
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "cpu_bytes_to_use": int(model.get("native_cpu_bytes", spec["native_cpu_bytes"]))
                },
            }
        else:
            kw["kv_transfer_config"] = {
                "kv_connector": "InferaKvdConnector",
                "kv_role": "kv_both",
                "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
                "kv_load_failure_policy": "recompute",
            }
        started = time.perf_counter()
        self.llm = LLM(**kw)
        self.start_s = time.perf_counter() - started
        vc = self.llm.llm_engine.vllm_config
        hma = not bool(getattr(vc.scheduler_config, "disable_hybrid_kv_cache_manager", False))
        graphs = getattr(vc.compilation_config, "cudagraph_mode", None)
        policy = os.environ.get("INFERA_KVD_LOAD_POLICY", "auto") if role != "native" else None
        emit(
            "INFO",
            model=model["name"],
            role=role,
            engine_start_s=round(self.start_s, 1),
            hma=hma,
            load_policy=policy,
            cudagraph_mode=getattr(graphs, "name", str(graphs)),
        )

    def gen(self, ids: list[int], retention: str | None = None) -> dict[str, Any]:
        from vllm.inputs import TokensPrompt

        extra = {"kv_transfer_params": {"infera_retention": retention}} if retention else None
        sp = self.sp(
            temperature=0.0,
            max_tokens=int(self.model["max_tokens"]),
            ignore_eos=True,
            detokenize=False,
            extra_args=extra,
        )
        t = time.perf_counter()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        ms = (time.perf_counter() - t) * 1000
        r: dict[str, Any] = {
            "ms": ms,
            "tokens": list(out.outputs[0].token_ids),
            "cached": int(out.num_cached_tokens or 0),
        }
        m = getattr(out, "metrics", None)  # the engine core's clock: queued, scheduled, first token
        first, sched = (getattr(m, "first_token_ts", None), getattr(m, "scheduled_ts", None))
        if first and sched:
            r["queue_ms"] = round((sched - getattr(m, "queued_ts", sched)) * 1000, 2)
            r["step_ms"] = round((first - sched) * 1000, 2)
        return r

    def reset(self) -> None:
        if not self.llm.reset_prefix_cache():
            emit("WARN", model=self.model["name"], what="reset_prefix_cache returned False")

    def poke(self) -> None:
        """A short request: one more engine step (the worker reports its counters there)."""
        self.gen(prompt(f"poke-{time.monotonic_ns()}", 8, self.model["vocab"]), "none")

    def warm_up(self) -> None:
        """Store a 512-token prompt, load it back (the hit path's first kernels and threads
        start here, not in a measured hit), hit it on the GPU; then one prompt per length."""
        v = self.model["vocab"]
        w = prompt("warm", 512, v)
        self.gen(w, "long")
        self.poke()
        time.sleep(0.5)  # saves complete asynchronously (both connectors)
        self.reset()
        self.gen(w)
        self.gen(w)  # a GPU prefix hit
        for n in self.model["sizes"]:
            self.reset()
            self.gen(prompt("shape", n, v), "none")


LOAD_COUNTERS = (
    "load_dma_us",
    "load_dma_bytes",
    "load_us",
    "load_lease_us",
    "load_chunks",
    "load_direct_bytes",
)


LAYERWISE_COUNTERS = (
    "load_layerwise_steps",
    "load_layerwise_waits",
    "load_layerwise_late_layers",
    "load_layerwise_scattered_steps",
    "load_layerwise_small_steps",
    # where a layer-wise step's time went (infera/engine/vllm/worker/gpu/steptrace.py)
    "load_lw_traced_steps",
    "load_lw_cpu_first_wait_us",
    "load_lw_cpu_us",
    "load_lw_gpu_us",
    "load_lw_dma_begin_us",
    "load_lw_dma_end_us",
)
# a step without loads (the warm GPU hits), from bind_connector_metadata to wait_for_save
STEP_COUNTERS = ("step_timed", "step_cpu_us", "step_gpu_us")
SKIPPED = tuple(R.SLOWER + t for t in R.TIERS)


def timed_hit(e: Engine, ids: list[int], retention: str | None = None) -> dict[str, Any]:
    """One measured hit; for kvd engines also the worker's DMA figures for it and what the
    load policy skipped."""
    kvd = e.role != "native"
    before = worker_counters(e.model["path"]) if kvd else {}
    sched = scheduler_counters(e.model["path"]) if kvd else {}
    e.reset()
    cpu = thread_cpu()
    r = e.gen(ids, retention)
    r["busy_threads"] = busiest(cpu, thread_cpu())
    if kvd:
        e.poke()
        after = worker_counters(e.model["path"])
        for k in (*LOAD_COUNTERS, *LAYERWISE_COUNTERS):
            r[k] = after.get(k, 0) - before.get(k, 0)
        now = scheduler_counters(e.model["path"])
        for k in (*SKIPPED, R.PREWARMED, R.UNPROMOTED, R.BY_POLICY, "sched_us"):
            r[k] = now.get(k, 0) - sched.get(k, 0)
        r["skipped_tokens"] = sum(r[k] for k in SKIPPED) + r[R.BY_POLICY]
    return r


def _sched_us(path: str) -> dict[str, float]:
    return {"sched_us": scheduler_counters(path).get("sched_us", 0)}


def timed_warm(e: Engine, ids: list[int]) -> dict[str, Any]:
    """One warm GPU hit; for kvd engines also its forward's CPU and GPU time (``step_*``).

    Counters reach the daemon at a step's end, its GPU time a step later, so two short requests
    follow the hit; what the second adds (one short request's CPU time and the first one's GPU
    time) is taken off what the hit and the first one added."""
    if e.role == "native":
        return e.gen(ids)
    path = e.model["path"]
    before = {**worker_counters(path), **_sched_us(path)}
    r = e.gen(ids)
    e.poke()
    mid = {**worker_counters(path), **_sched_us(path)}
    e.poke()
    after = {**worker_counters(path), **_sched_us(path)}
    for k in (*STEP_COUNTERS, "sched_us"):
        r[k] = (mid.get(k, 0) - before.get(k, 0)) - (after.get(k, 0) - mid.get(k, 0))
    r["step_timed"] = 1 if r.get("step_cpu_us", 0) > 0 else 0
    return r


def split_refs(e: Engine, ids: list[int], step: int) -> dict[str, list[int]]:
    """vLLM's own answer for a hit cut short at every ``step`` tokens: its prefix cache holding
    the first ``L`` tokens (a request of them, just before), the rest computed. A kvd hit the
    load policy cut at ``L`` must give these tokens (``L = 0``: a full prefill). Runs before the
    daemon holds ``ids`` (retention ``none``), so every ``L`` is vLLM's cache alone."""
    refs: dict[str, list[int]] = {}
    for cut in range(0, len(ids), step):
        e.reset()
        if cut:
            e.gen(ids[:cut], "none")
        r = e.gen(ids, "none")
        if r["cached"] == cut:  # the prefix cache held exactly the cut (else no reference)
            refs[str(cut)] = r["tokens"]
    return refs


def turn(main: list[int], tag: str, extra: int, vocab: int) -> list[int]:
    """The next turn of a conversation: the main prompt and ``extra`` new tokens."""
    return main + prompt(f"turn-{tag}", extra, vocab)


def run(spec: dict[str, Any], role: str) -> None:
    R = int(spec["repeat"])
    engines = []
    for model in spec["models"]:
        try:
            e = Engine(model, role, spec)
        except Exception as exc:
            emit("ERROR", model=model["name"], role=role, error=f"{type(exc).__name__}: {exc}"[:2000])
            continue
        e.warm_up()
        engines.append(e)
        v = model["vocab"]
        for n in model["sizes"]:
            P = prompt("main", n, v)
            out: dict[str, Any] = {"model": model["name"], "role": role, "tokens": n}
            extras = [int(x) for x in model.get("partial") or []] if n == model.get("partial_at") else []
            # warm GPU hits right after the full prefill: the tail is computed from the engine's
            # own KV, the reference every hit's tokens are checked against
            if role == "native":
                e.reset()
                out["store"] = e.gen(P)
                out["warm"] = [e.gen(P) for _ in range(R)]
                e.poke()
                time.sleep(1.0)  # its saves are asynchronous
                e.poke()
                out["hit"] = [timed_hit(e, P) for _ in range(R)]
                out["partial"] = {x: [timed_hit(e, turn(P, f"n{i}", x, v)) for i in range(R)] for x in extras}
            elif role == "kvd-a":
                on_disk = bool(model.get("disk", True))
                out["recompute"] = []
                for _ in range(R):
                    e.reset()
                    out["recompute"].append(e.gen(P, "none"))
                out["partial_recompute"] = {}
                for x in extras:  # before the main prompt is stored: nothing to load
                    out["partial_recompute"][x] = []
                    for i in range(R):
                        e.reset()
                        out["partial_recompute"][x].append(e.gen(turn(P, f"r{i}", x, v), "none"))
                step = int(model.get("split_tokens") or 0)
                if step:  # references for hits the load policy cuts short (before any store)
                    out["split_ref"] = split_refs(e, P, step)
                    out["disk_split_ref"] = [
                        split_refs(e, prompt(f"disk{i}", n, v), step) for i in range(R if on_disk else 0)
                    ]
                e.reset()
                out["store"] = e.gen(P, "long" if on_disk else "short")  # no disk rows: RAM only
                out["warm"] = [timed_warm(e, P) for _ in range(R)]
                out["disk_store"], out["disk_warm"] = [], []
                for i in range(R if on_disk else 0):
                    e.reset()
                    out["disk_store"].append(e.gen(prompt(f"disk{i}", n, v), "long"))
                    out["disk_warm"].append(e.gen(prompt(f"disk{i}", n, v)))
                out["seal_wait_s"] = wait_stored()
                out["hit"] = [timed_hit(e, P) for _ in range(R)]
                out["partial"] = {x: [timed_hit(e, turn(P, f"k{i}", x, v)) for i in range(R)] for x in extras}
            else:
                out["cross"] = [timed_hit(e, P) for _ in range(R)]
            emit("RESULT", **out)
    if role != "kvd-b" or not engines:  # no engine came up: no disk hits, no daemon restart
        return
    print("RESTART", flush=True)
    line = sys.stdin.readline().strip()
    emit("INFO", restart=line)
    for e in engines:
        v = e.model["vocab"]
        # a stored request makes the worker reopen its connection (and register the new arena
        # mapping) now, not inside the first timed disk hit
        e.reset()
        e.gen(prompt(f"reconnect-{time.time_ns()}", 512, v), "long")
        e.poke()
        if not e.model.get("disk", True):
            continue
        for n in e.model["sizes"]:
            since = prewarmed_total()
            disk = [timed_hit(e, prompt(f"disk{i}", n, v)) for i in range(R)]
            # a disk hit judged slower than recompute was prewarmed: let the reads land first
            waited = wait_prewarmed(since, int(sum(d.get("prewarm_chunks", 0) for d in disk)))
            after = [timed_hit(e, prompt(f"disk{i}", n, v)) for i in range(R)]
            emit(
                "RESULT",
                model=e.model["name"],
                role="kvd-disk",
                tokens=n,
                disk=disk,
                after_disk=after,
                prewarm_wait_s=round(waited, 2),
            )


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    role = sys.argv[2]
    if role not in ROLES:
        raise SystemExit(f"role must be one of {ROLES}")
    run(spec, role)
    emit("DONE", role=role)
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's slow teardown


if __name__ == "__main__":
    main()
