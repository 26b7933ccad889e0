"""The engine side of ``kvd bench compare``'s TTFT part: runs inside a Python that has vLLM.

``python -m infera.bench.compare_engine SPEC.json`` builds (or reuses) the random-weight Llama of
``kvd bench ttft``, starts one in-process vLLM engine with the spec's ``kv_transfer_config`` (or
none), sends one warm-up request, then runs the spec's requests in order. Before each request the
engine's own prefix cache is cleared, so whatever is not recomputed came through the connector.
Time to first token is the wall time of a request for one output token; for InferaKvdConnector
the time and bytes of its copies into the engine are recorded too (the worker's counters). Prints ``RESULT {json}``;
a failure to build the engine prints ``ENGINE-ERROR {json}`` with the exception, so the caller can
report the exact error of a peer that cannot run here.

Spec::

    {"model": DIR, "hidden": N, "layers": N, "vocab": N, "kv_cache_bytes": N, "max_model_len": N,
     "max_num_batched_tokens": N (default max_model_len: one step per prompt),
     "kv_transfer_config": {...} | null,
     "requests": [{"name": "4096/hit", "tokens": 4096, "seed": 1, "retention": "long" | null,
                   "reset": true}]}

``reset: false`` keeps the engine's prefix cache (the request before it stays cached). The same ``tokens``/``seed`` pair gives the same prompt in every engine process.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def prompt_ids(tokens: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed * 1_000_003 + tokens)
    return [rng.randrange(3, vocab) for _ in range(tokens)]


def _error_line(stage: str, exc: BaseException, request: str | None = None) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return "ENGINE-ERROR " + json.dumps(
        {
            "stage": stage,
            "request": request,
            "type": type(exc).__name__,
            "message": str(exc)[:600],
            "where": where,
        }
    )


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from infera.bench.ttft_engine import build_model, one_token_request

    info = build_model(Path(spec["model"]), spec["hidden"], spec["layers"], spec["vocab"])
    from vllm import LLM

    started = time.monotonic()
    kw: dict[str, Any] = {}
    if spec.get("kv_transfer_config"):
        kw["kv_transfer_config"] = spec["kv_transfer_config"]
    try:
        llm = LLM(
            model=spec["model"],
            skip_tokenizer_init=True,
            enable_prefix_caching=True,
            max_model_len=int(spec["max_model_len"]),
            max_num_seqs=1,
            max_num_batched_tokens=int(spec.get("max_num_batched_tokens") or spec["max_model_len"]),
            seed=0,
            enforce_eager=True,
            kv_cache_memory_bytes=int(spec["kv_cache_bytes"]),
            disable_log_stats=False,
            **kw,
        )
    except Exception as exc:
        print(_error_line("engine start", exc), flush=True)
        traceback.print_exc()
        os._exit(3)
    start_s = time.monotonic() - started
    vocab = int(info["vocab"])

    def request(ids: list[int], retention: str | None, reset: bool = True) -> dict[str, Any]:
        r = one_token_request(llm, ids, retention, reset)
        return {
            "seconds": r["seconds"],
            "token": r["token_ids"][:1],
            "cached_tokens": r["cached_tokens"],
            "external_hits": r["external_hits"],
            "load_s": r["counters"].get("load_us", 0) / 1e6,
            "load_bytes": r["counters"].get("load_bytes", 0),
        }

    results: list[dict[str, Any]] = []
    current = "warm-up"
    try:
        request(prompt_ids(64, 999_999, vocab), "none")  # warm-up: first-call costs, nothing stored
        for req in spec["requests"]:
            current = req["name"]
            ids = prompt_ids(int(req["tokens"]), int(req["seed"]), vocab)
            res = request(ids, req.get("retention"), reset=bool(req.get("reset", True)))
            res.update(name=req["name"], tokens=int(req["tokens"]))
            results.append(res)
            print("STEP " + json.dumps(res), flush=True)
    except Exception as exc:
        print(_error_line(f"request {len(results) + 1}", exc, current), flush=True)
        traceback.print_exc()
        os._exit(4)
    print("RESULT " + json.dumps({"model": info, "engine_start_s": start_s, "requests": results}), flush=True)
    os._exit(0)  # skip vLLM's slow interpreter teardown; everything is printed


if __name__ == "__main__":
    main()
