"""Run one real vLLM engine (in-process, CPU) through a list of steps; print one JSON result.

Used by the tests in this directory so that each engine is a fresh Python process, exactly as
two engines on one host are. Usage: ``python engine_runner.py SPEC.json``, where the spec is::

    {"model": DIR, "kv_transfer_config": {...} | null, "kv_cache_bytes": N, "max_model_len": N,
     "engine_kw": {more LLM(...) arguments}, "baseline_first": false,
     "steps": [{"op": "generate", "name": "p1", "prompt": [ids], "max_tokens": 8,
                "retention": "long" | null},
               {"op": "reset_prefix_cache"},
               {"op": "noise", "name": "p1", "prompt": [ids], "kinds": ["sliding"] | null},
               {"op": "keys", "name": "p1", "prompt": [ids]},
               {"op": "restart", "name": "with-connector"},
               {"op": "signal", "path": FILE}, {"op": "wait_file", "path": FILE},
               {"op": "statctl", "name": "stats"}, {"op": "connector", "name": "c"},
               {"op": "wait_for_daemon"}, {"op": "sleep", "seconds": 1.5}]}

``baseline_first`` starts the engine without the connector; ``restart`` then replaces it, in the
same process, with an engine that has it (a second start costs a second or two, not an import of
vLLM). ``start`` and ``restart`` report the engine's KV cache capacity in tokens as vLLM computes
it, its KV cache groups and whether the hybrid KV cache manager is off. ``keys`` and ``noise``
cover every KV cache group (``kinds`` picks groups by kind: ``full``, ``sliding``, ...).
``connector`` reports the scheduler half's counters and the load policy's rates and samples.
``wait_for_daemon`` writes the marker file named by the second argument, then waits until a
daemon answers on ``$INFERA_KVD_SOCKET``.

The last line of stdout is ``RESULT {json}`` with one entry per step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from typing import Any


def _counters(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name in (
            "vllm:external_prefix_cache_hits",
            "vllm:external_prefix_cache_queries",
            "vllm:prefix_cache_hits",
        ):
            out[m.name.split(":", 1)[1]] = float(getattr(m, "value", 0) or 0)
    return out


def _connector(llm: Any) -> Any:
    """The scheduler-side connector of an in-process engine (None without one)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    return getattr(getattr(core, "scheduler", None), "connector", None)


def _chunk_keys(llm: Any, prompt: list[int], kinds: list[str] | None = None) -> tuple[Any, list[bytes]]:
    """The namespace and the keys of every whole chunk of ``prompt`` (of groups of ``kinds``)."""
    from infera.engine.vllm import groups
    from infera.engine.vllm.api.prewarm import prompt_keys

    conn = _connector(llm)
    plan = getattr(conn, "_plan", None)
    if plan is not None and kinds:
        keep = tuple(g if g.kind in kinds else replace(g, offload=False) for g in plan.groups)
        plan = groups.Plan(keep, plan.chunk_tokens)
    ns, keys, _chunks = prompt_keys(llm.llm_engine.vllm_config, prompt, plan=plan)
    return ns, keys


def _start(spec: dict[str, Any], connector: bool) -> tuple[Any, dict[str, Any]]:
    from vllm import LLM

    kw: dict[str, Any] = dict(spec.get("engine_kw") or {})
    if connector and spec.get("kv_transfer_config") is not None:
        kw["kv_transfer_config"] = spec["kv_transfer_config"]
    started = time.monotonic()
    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        max_model_len=spec.get("max_model_len", 2048),
        max_num_seqs=4,
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=spec.get("kv_cache_bytes", 32 << 20),
        disable_log_stats=False,
        **kw,
    )
    info: dict[str, Any] = {"seconds": round(time.monotonic() - started, 2), "connector": connector}
    vc = llm.llm_engine.vllm_config
    info["hma_disabled"] = bool(getattr(vc.scheduler_config, "disable_hybrid_kv_cache_manager", False))
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    kvc = getattr(getattr(core, "scheduler", None), "kv_cache_config", None)
    if kvc is not None:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

        info["kv_cache_tokens"] = int(get_kv_cache_capacity(vc, kvc)[0])
        info["num_blocks"] = int(kvc.num_blocks)
        info["groups"] = [type(g.kv_cache_spec).__name__ for g in kvc.kv_cache_groups]
    return llm, info


def _stop(llm: Any) -> None:
    import gc

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, info = _start(spec, connector=not spec.get("baseline_first"))
    results: list[dict[str, Any]] = [{"op": "start", "name": "start", **info}]
    for step in spec["steps"]:
        op = step["op"]
        res: dict[str, Any] = {"op": op, "name": step.get("name")}
        if op == "generate":
            extra: dict[str, Any] = {}
            if step.get("retention") is not None:
                extra["kv_transfer_params"] = {"infera_retention": step["retention"]}
            sp = SamplingParams(
                temperature=0.0,
                max_tokens=step.get("max_tokens", 8),
                ignore_eos=True,
                extra_args=extra or None,
            )
            before = _counters(llm)
            t0 = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=step["prompt"])], sp, use_tqdm=False)
            res["seconds"] = round(time.perf_counter() - t0, 4)
            after = _counters(llm)
            res["tokens"] = list(out[0].outputs[0].token_ids)
            res["num_cached_tokens"] = out[0].num_cached_tokens
            res["external_hits"] = after.get("external_prefix_cache_hits", 0) - before.get(
                "external_prefix_cache_hits", 0
            )
            res["external_queries"] = after.get("external_prefix_cache_queries", 0) - before.get(
                "external_prefix_cache_queries", 0
            )
        elif op == "restart":
            _stop(llm)
            llm, info = _start(spec, connector=True)
            res.update(info)
        elif op == "reset_prefix_cache":
            res["ok"] = bool(llm.reset_prefix_cache())
        elif op in ("keys", "noise"):
            from infera.kvd.client import KvdClient

            ns, keys = _chunk_keys(llm, step["prompt"], step.get("kinds"))
            res["namespace"] = ns.name
            res["keys"] = [k.hex() for k in keys]
            with KvdClient(os.environ["INFERA_KVD_SOCKET"], namespace=ns.name, name="test-noise") as c:
                res["present"] = c.lookup(keys)
                if op == "noise":
                    import torch

                    g = torch.Generator().manual_seed(1)
                    overwritten = 0
                    for key in keys:
                        old = c.get(key)
                        if old is None:
                            continue
                        noise = (torch.randn(len(old) // 2, generator=g) * 5).to(torch.bfloat16)
                        c.put(key, noise.view(torch.uint8).numpy().tobytes(), overwrite=True)
                        overwritten += 1
                    res["overwritten"] = overwritten
        elif op == "connector":
            sched = _connector(llm)._scheduler
            res["counters"] = dict(sched.counters)
            res["rates"] = dict(sched.policy.report())
            res["samples"] = dict(sched.policy.costs.samples)
        elif op == "statctl":
            import subprocess

            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "infera.kvd.statctl",
                    "--socket",
                    os.environ["INFERA_KVD_SOCKET"],
                    "--json",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            res["stats"] = json.loads(out.stdout)
            text = subprocess.run(
                [sys.executable, "-m", "infera.kvd.statctl", "--socket", os.environ["INFERA_KVD_SOCKET"]],
                capture_output=True,
                text=True,
                check=True,
            )
            res["text"] = text.stdout
        elif op == "signal":  # tell the test this engine got here (it may run another engine now)
            with open(step["path"], "w") as fh:
                fh.write("ready\n")
        elif op == "wait_file":  # stay up, connected, until the test says so
            deadline = time.monotonic() + step.get("timeout", 600)
            while not os.path.exists(step["path"]):
                if time.monotonic() > deadline:
                    raise SystemExit(f"no {step['path']} within {step.get('timeout', 600)} s")
                time.sleep(0.1)
        elif op == "sleep":
            time.sleep(step.get("seconds", 1.0))
        elif op == "wait_for_daemon":
            from infera.kvd.client import KvdClient, KvdClientError

            with open(sys.argv[2], "w") as fh:
                fh.write("waiting\n")
            deadline = time.monotonic() + step.get("timeout", 60)
            while True:
                try:
                    with KvdClient(os.environ["INFERA_KVD_SOCKET"], want_arena=False, timeout=2) as c:
                        res["ok"] = c.ping()
                    break
                except KvdClientError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        else:
            raise SystemExit(f"unknown op {op!r}")
        results.append(res)
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
