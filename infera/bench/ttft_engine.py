"""The engine side of ``kvd bench ttft``: runs inside a Python that has vLLM.

``python -m infera.bench.ttft_engine SPEC.json`` builds (or reuses) a random-weight Llama, starts
one in-process vLLM engine with InferaKvdConnector on ``$INFERA_KVD_SOCKET`` and, for each prompt
length, times three requests for the same prompt, clearing the engine's own prefix cache before
each: *recompute* (``infera_retention=none``: nothing loaded, nothing stored), *store* (computed
and saved) and *hit* (loaded from the daemon). Time to first token is the wall time of a request
for one output token. Prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any


def build_model(path: Path, hidden: int, layers: int, vocab: int) -> dict[str, Any]:
    """A Llama with random bf16 weights (``initializer_range`` 0.02: real-looking activations)."""
    info_path = path / "infera-bench.json"
    if info_path.exists():
        return dict(json.loads(info_path.read_text()))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // 64)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        vocab_size=vocab,
        max_position_embeddings=32768,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    info = {
        "params": params,
        "weight_bytes": params * 2,
        "hidden": hidden,
        "layers": layers,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": 64,
        "vocab": vocab,
    }
    info_path.write_text(json.dumps(info))
    return info


def _copy_counters() -> dict[str, int]:
    """The worker half's copy counters (in-process engine: the worker lives in this process)."""
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        worker = getattr(get_kv_transfer_group(), "_worker", None)
        return dict(worker.counters) if worker is not None else {}
    except Exception:
        return {}


def _external_hits(llm: Any) -> float:
    for m in llm.get_metrics():
        if m.name == "vllm:external_prefix_cache_hits":
            return float(getattr(m, "value", 0) or 0)
    return 0.0


def one_token_request(llm: Any, ids: list[int], retention: str | None, reset: bool = True) -> dict[str, Any]:
    """One timed request of the in-process engine ``llm`` for one output token of prompt ``ids``.

    ``retention`` goes to InferaKvdConnector as ``infera_retention`` (``None``: the default);
    ``reset`` clears the engine's own prefix cache first, so whatever is not recomputed came
    through the connector. Returns the wall time (``seconds``), the output ``token_ids``, the
    engine's ``cached_tokens``, the connector's ``external_hits`` and the change of the worker's
    copy ``counters`` (``load_us``, ``save_bytes``, ...)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"kv_transfer_params": {"infera_retention": retention}} if retention else None
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, extra_args=extra)
    if reset:
        llm.reset_prefix_cache()
    before, counters = _external_hits(llm), _copy_counters()
    t = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)
    took = time.perf_counter() - t
    after = _copy_counters()
    return {
        "seconds": took,
        "token_ids": list(out[0].outputs[0].token_ids),
        "cached_tokens": int(out[0].num_cached_tokens or 0),
        "external_hits": _external_hits(llm) - before,
        "counters": {k: after.get(k, 0) - counters.get(k, 0) for k in after},
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    info = build_model(Path(spec["model"]), spec["hidden"], spec["layers"], spec["vocab"])
    from vllm import LLM

    sizes = [int(n) for n in spec["sizes"]]
    started = time.monotonic()
    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        max_model_len=max(sizes) + 64,
        max_num_seqs=1,
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=int(spec["kv_cache_bytes"]),
        disable_log_stats=False,
        kv_transfer_config={
            "kv_connector": "InferaKvdConnector",
            "kv_role": "kv_both",
            "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
            "kv_load_failure_policy": "recompute",
        },
    )
    start_s = time.monotonic() - started
    vocab = int(info["vocab"])

    copies: dict[str, int] = {}

    def request(ids: list[int], retention: str | None) -> tuple[float, list[int], float]:
        r = one_token_request(llm, ids, retention)
        copies.clear()
        copies.update(r["counters"])
        return r["seconds"], r["token_ids"], r["external_hits"]

    rng = random.Random(0)
    request([rng.randrange(3, vocab) for _ in range(64)], "none")  # warm-up
    rows = []
    for n in sizes:
        for _rep in range(int(spec.get("repeat", 1))):
            ids = [rng.randrange(3, vocab) for _ in range(n)]
            recompute_s, t_recompute, _ = request(ids, "none")
            store_s, _t_store, _ = request(ids, "long")
            saved = dict(copies)
            hit_s, t_hit, hits = request(ids, None)
            loaded = dict(copies)
            rows.append(
                {
                    "tokens": n,
                    "recompute_s": recompute_s,
                    "store_s": store_s,
                    "hit_s": hit_s,
                    "hit_tokens": hits,
                    "same_token": t_recompute == t_hit,
                    "save_s": saved.get("save_us", 0) / 1e6,
                    "save_bytes": saved.get("save_bytes", 0),
                    "load_s": loaded.get("load_us", 0) / 1e6,
                    "load_bytes": loaded.get("load_bytes", 0),
                }
            )
    print("RESULT " + json.dumps({"model": info, "engine_start_s": start_s, "rows": rows}), flush=True)
    os._exit(0)  # skip vLLM's slow interpreter teardown; everything is printed


if __name__ == "__main__":
    main()
