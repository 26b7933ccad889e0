"""What an engine tells the connector, for tests: its facts, and a worker half on a daemon socket."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infera.engine.vllm.keys import EngineFacts

if TYPE_CHECKING:
    from infera.engine.vllm.config import ConnectorEnv
    from infera.engine.vllm.worker.half import WorkerHalf


def engine_facts(
    *,
    model: str = "/m/tiny",
    num_layers: int = 2,
    kv_heads: int = 2,
    head_size: int = 32,
    block_size: int = 16,
    **over: Any,
) -> EngineFacts:
    """A bf16 Llama's facts (no TP/PP, sha256 with the fixed seed, vLLM 0.32 on CPU), its
    ``bytes_per_token`` from the shape; ``over`` sets any other field."""
    fields: dict[str, Any] = {
        "model": model,
        "model_type": "llama",
        "num_layers": num_layers,
        "total_kv_heads": kv_heads,
        "kv_heads_per_rank": kv_heads,
        "head_size": head_size,
        "use_mla": False,
        "dtype": "bfloat16",
        "kv_cache_dtype": "auto",
        "block_size": block_size,
        "hash_block_size": block_size,
        "bytes_per_token": num_layers * 2 * kv_heads * head_size * 2,  # K and V, 2 bytes each
        "tp_size": 1,
        "pp_size": 1,
        "hash_algo": "sha256",
        "hash_seed": "fixed",
        "vllm_version": "0.32",
        "platform": "cpu",
    }
    return EngineFacts(**{**fields, **over})


def worker_half(
    facts: EngineFacts,
    chunk_tokens: int,
    sock: str,
    num_blocks: int,
    *,
    env: ConnectorEnv | None = None,
    name: str = "t",
    blockers: Sequence[Any] = (),
    gpu_path_on_cpu: bool = False,
) -> WorkerHalf:
    """Rank 0's worker half for ``facts``, linked to the daemon at ``sock`` (not connected yet).
    Imports torch: only the tests that build a worker need it."""
    from infera.engine.vllm.config import ConnectorEnv
    from infera.engine.vllm.keys import make_namespace
    from infera.engine.vllm.link import DaemonLink
    from infera.engine.vllm.worker.half import WorkerHalf

    ns = make_namespace(facts, chunk_tokens)
    link = DaemonLink(sock, ns, role="vllm-worker-0", name=name, model=facts.model, want_arena=True)
    return WorkerHalf(
        ns,
        env or ConnectorEnv(socket=sock),
        rank=0,
        replicated=False,
        link=link,
        blockers=list(blockers),
        num_blocks=num_blocks,
        block_size=facts.block_size,
        gpu_path_on_cpu=gpu_path_on_cpu,
    )
