"""The models of ``kvd bench gpu-e2e``: Llama-3.1-8B and Gemma-3-12B shapes (or tiny ones), built on disk, and the KV bytes a prompt of each loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infera.errors import UsageError
from infera.keyrules import auto_chunk_tokens

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "mlp_bias": False,
}
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
SMALL.update(num_key_value_heads=2, head_dim=32, vocab_size=4096)


#: Gemma-3-12B's text model (google/gemma-3-12b-it's text_config): 48 layers, 5 local (1,024-token
#: window) per global, 8 KV heads of 256. Built with the installed transformers' Gemma3TextConfig.
GEMMA3_12B = {
    "hidden_size": 3840,
    "intermediate_size": 15360,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "sliding_window": 1024,
    "query_pre_attn_scalar": 256,
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
}
GEMMA3_SMALL = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 200,
    "query_pre_attn_scalar": 32,
    "vocab_size": 4096,
    "max_position_embeddings": 32768,
}
SLIDING_PATTERN = 6


def _kv_bytes_per_token(cfg: dict[str, Any], elem: int = 2) -> int:
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * elem


def _hybrid_bytes(cfg: dict[str, Any], elem: int = 2) -> dict[str, Any]:
    """KV bytes per token of the global layers, of the sliding ones, and the window: a hit of n
    tokens loads n tokens of the first and min(n, window) of the second."""
    types = cfg.get("layer_types") or []
    n_sliding = sum(t == "sliding_attention" for t in types)
    per_layer = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * elem
    return {
        "bytes_per_token": (cfg["num_hidden_layers"] - n_sliding) * per_layer,
        "window_bytes_per_token": n_sliding * per_layer,
        "window": cfg["sliding_window"],
    }


def loaded_bytes(model: dict[str, Any], tokens: float) -> float:
    """KV bytes a hit of ``tokens`` tokens brings back (sliding layers: their window only)."""
    out = tokens * model["bytes_per_token"]
    if model.get("window"):
        out += min(tokens, model["window"]) * model.get("window_bytes_per_token", 0)
    return out


def build_gemma3_model(path: Path, dims: dict[str, Any], weights: bool = False) -> dict[str, Any]:
    """A Gemma-3-shaped text model (``Gemma3ForCausalLM``): its config (dummy weights) or, with
    ``weights``, random-initialised saved weights (the token check). The config comes from the
    installed transformers, so the file is in the format that version (and vLLM) reads."""
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(
        **dims,
        sliding_window_pattern=SLIDING_PATTERN,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        initializer_range=0.02,  # Gemma scales embeddings by sqrt(hidden): keep greedy output varied
        torch_dtype="bfloat16",
    )
    cfg.architectures = ["Gemma3ForCausalLM"]
    path.mkdir(parents=True, exist_ok=True)
    if weights:
        import torch
        from transformers import Gemma3ForCausalLM

        torch.manual_seed(0)
        Gemma3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    else:
        cfg.save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def build_timing_model(path: Path, small: bool) -> dict[str, Any]:
    cfg = dict(LLAMA_8B)
    if small:
        cfg.update(SMALL)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return cfg


def build_check_model(path: Path, small: bool) -> dict[str, Any]:
    """A small Llama with real (random-initialised, saved) weights: the token oracle."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
    if not small:
        dims = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8)
    cfg = LlamaConfig(
        **dims,
        num_key_value_heads=dims["num_attention_heads"],
        head_dim=64 if not small else 32,
        vocab_size=1000,
        max_position_embeddings=4096,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def build_models(
    workdir: Path,
    lengths: list[int],
    small: bool,
    check: bool,
    hybrid: list[int],
    partial: list[int] | None = None,
) -> list[dict[str, Any]]:
    """The spec's models: the token-check ones (real random weights), the Llama timing model
    (with ``partial`` new-token counts: the partial hits at its largest length) and, with
    ``hybrid`` sizes, the Gemma-3-shaped one."""
    try:  # the token check's weights and the hybrid configs come from torch and transformers
        if check or hybrid:
            import torch  # noqa: F401
            import transformers  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"the token check and the hybrid rows build their models with torch and transformers, "
            f"which do not import here ({exc})",
            hint="run kvd bench gpu-e2e with the Python that has vLLM, or pass --no-check --gemma3-sizes ''",
        ) from None
    models: list[dict[str, Any]] = []
    # k whole chunks (256 tokens here) + 1: every hit kind computes exactly one token
    check_sizes = [513, 1025] if small else [1025, 2817]
    if check:
        cfg = build_check_model(workdir / "check", small)
        models.append(
            {
                "name": "check: Llama, real random weights",
                "path": str(workdir / "check"),
                # the chunk (auto, vLLM's 16-token blocks): references for hits cut short at
                # every chunk end (gpu_e2e_engine.split_refs)
                "split_tokens": auto_chunk_tokens(_kv_bytes_per_token(cfg), 16),
                "max_model_len": 4096,
                "max_num_batched_tokens": 4096,
                "sizes": check_sizes,
                "max_tokens": 8,
                "vocab": cfg["vocab_size"],
                "bytes_per_token": _kv_bytes_per_token(cfg),
                "gpu_memory_utilization": 0.1,
                "native_cpu_bytes": 1 << 30,
            }
        )
        if hybrid:
            cfg = build_gemma3_model(workdir / "check-gemma3", GEMMA3_SMALL, weights=True)
            models.append(
                {
                    "name": "check: Gemma-3-style, real random weights",
                    "path": str(workdir / "check-gemma3"),
                    "max_model_len": 4096,
                    "max_num_batched_tokens": 4096,
                    "sizes": check_sizes,
                    "max_tokens": 8,
                    "vocab": cfg["vocab_size"],
                    **_hybrid_bytes(cfg),
                    "gpu_memory_utilization": 0.1,
                    "native_cpu_bytes": 1 << 30,
                    "disk": False,
                }
            )
    cfg = build_timing_model(workdir / "timing", small)
    max_len = max(lengths)
    models.append(
        {
            "name": "Llama-3.1-8B shape, dummy weights" if not small else "small Llama, dummy weights",
            "path": str(workdir / "timing"),
            "load_format": "dummy",
            "max_model_len": max_len + max(partial or [0]) + 512,
            "max_num_batched_tokens": max(max_len, 2048),
            "sizes": lengths,
            "max_tokens": 1,
            "vocab": cfg["vocab_size"],
            "bytes_per_token": _kv_bytes_per_token(cfg),
            "gpu_memory_utilization": 0.3,
            "partial": list(partial or []),
            "partial_at": max_len,
        }
    )
    if hybrid:
        dims = dict(GEMMA3_SMALL if small else GEMMA3_12B)
        dims["max_position_embeddings"] = max(dims["max_position_embeddings"], max(hybrid) + 512)
        cfg = build_gemma3_model(workdir / "timing-gemma3", dims)
        models.append(
            {
                "name": "Gemma-3-12B shape, dummy weights" if not small else "small Gemma-3, dummy weights",
                "path": str(workdir / "timing-gemma3"),
                "load_format": "dummy",
                "max_model_len": max(hybrid) + 512,
                "max_num_batched_tokens": max(max(hybrid), 2048),
                "sizes": hybrid,
                "max_tokens": 1,
                "vocab": cfg["vocab_size"],
                **_hybrid_bytes(cfg),
                # every engine of a process keeps its models alive: 0.1 + 0.1 + 0.3 + 0.35
                "gpu_memory_utilization": 0.35,
                # vLLM's CPU tier keeps the sliding groups' blocks too: room for two prompts
                "native_cpu_bytes": int(2.5 * max(hybrid) * _kv_bytes_per_token(cfg)),
                "disk": False,
            }
        )
    return models
