"""Chunk size, namespace, hash settings and chunk keys (architecture decision 4).

Pure functions over plain facts, shared by the scheduler half, the worker half and the prewarm
route, so the three can never derive different keys. Nothing here imports vLLM; ``compat``
turns a ``VllmConfig`` into :class:`EngineFacts`.

* A *chunk* is ``chunk_tokens`` consecutive prompt tokens, a whole number of vLLM blocks.
* A chunk's *hash* is vLLM's block hash of its last block: the chain hash already covers the
  whole prefix up to there.
* A chunk's *key* is ``blake2b(namespace digest, rank, chunk hash)``; every rank of a
  tensor/pipeline-parallel engine stores its own shard under its own key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

KEY_BYTES = 32
FORMAT_VERSION = 1

# Chunk sizing (docs/connector.md has the table): small chunks on the RAM path so short prompts
# still fill whole chunks, large ones where GPU-direct reads need size to pay off.
RAM_TARGET_BYTES = 4 << 20
RAM_MAX_TOKENS = 256
GPU_DIRECT_MIN_BYTES = 128 << 20


def auto_chunk_tokens(bytes_per_token: int, block_size: int, gpu_direct: bool = False) -> int:
    """The ``INFERA_KVD_CHUNK_TOKENS=auto`` rule: a whole number of blocks.

    RAM path: the largest multiple of ``block_size`` whose chunk stays within 4 MiB and 256
    tokens, and at least one block. GPU-direct: the smallest multiple of ``block_size`` whose
    chunk reaches 128 MiB.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    per_block = max(1, bytes_per_token) * block_size
    if gpu_direct:
        blocks = -(-GPU_DIRECT_MIN_BYTES // per_block)
        return max(1, blocks) * block_size
    blocks = min(RAM_TARGET_BYTES // per_block, RAM_MAX_TOKENS // block_size)
    return max(1, blocks) * block_size


def resolve_chunk_tokens(
    requested: int | None, bytes_per_token: int, block_size: int, gpu_direct: bool = False
) -> int:
    """A fixed value is rounded up to a whole number of blocks; None means auto."""
    if requested is None:
        return auto_chunk_tokens(bytes_per_token, block_size, gpu_direct)
    return -(-requested // block_size) * block_size


def hash_seed_mode(python_hash_seed: str | None, algo: str, fixed_seed_release: bool) -> str:
    """How vLLM seeds its block-hash chain in this process (research, vllm-connector.md §4).

    ``env:<value>`` when PYTHONHASHSEED is set; ``fixed`` where vLLM >= 0.29 seeds sha256 with a
    constant; ``random`` when the seed is drawn per process (keys then never match elsewhere).
    """
    if python_hash_seed is not None:
        return f"env:{python_hash_seed}"
    if fixed_seed_release and not algo.startswith("xxhash"):
        return "fixed"
    return "random"


@dataclass(frozen=True)
class EngineFacts:
    """Everything about an engine that changes the bytes or the keys of a chunk."""

    model: str
    model_type: str
    num_layers: int
    total_kv_heads: int
    kv_heads_per_rank: int
    head_size: int
    use_mla: bool
    dtype: str
    kv_cache_dtype: str
    block_size: int
    hash_block_size: int
    bytes_per_token: int
    tp_size: int
    pp_size: int
    hash_algo: str
    hash_seed: str
    vllm_version: str
    platform: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def replicated(self) -> bool:
        """MLA latents are identical on every TP rank: rank 0's copy serves all."""
        return self.use_mla


@dataclass(frozen=True)
class Namespace:
    """The namespace one engine declares at HELLO, and the settings it hashes with."""

    name: str
    digest: bytes
    chunk_tokens: int
    hash_settings: dict[str, Any]
    hash_fingerprint: str
    description: dict[str, Any]


def _digest(obj: Any, size: int = 16) -> bytes:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=size).digest()


_process_nonce = os.urandom(6).hex()


def hash_settings_of(facts: EngineFacts) -> tuple[dict[str, Any], str]:
    """The hash settings and their short fingerprint, as declared at HELLO.

    Two engines share chunks only when their fingerprints agree. A per-process random seed gets
    a per-process fingerprint, so the daemon reports the disagreement instead of hiding it.
    """
    settings = {
        "algo": facts.hash_algo,
        "seed": facts.hash_seed,
        "block_size": facts.hash_block_size,
    }
    fp = _digest(settings, 6).hex()
    if facts.hash_seed == "random":
        fp = f"random-{_process_nonce}"
    return settings, fp


def make_namespace(facts: EngineFacts, chunk_tokens: int) -> Namespace:
    settings, fingerprint = hash_settings_of(facts)
    description = {**asdict(facts), "chunk_tokens": chunk_tokens, "format": FORMAT_VERSION}
    description["hash_fingerprint"] = fingerprint
    digest = _digest(description)
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(facts.model.rstrip("/")) or "model")[:80]
    return Namespace(
        name=f"vllm/{label}/{digest.hex()}",
        digest=digest,
        chunk_tokens=chunk_tokens,
        hash_settings=settings,
        hash_fingerprint=fingerprint,
        description=description,
    )


def chunk_key(ns_digest: bytes, chunk_hash: bytes, rank: int = 0) -> bytes:
    """The daemon key of one rank's shard of one chunk."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(ns_digest)
    h.update(rank.to_bytes(4, "big"))
    h.update(bytes(chunk_hash))
    return h.digest()


def chunk_hashes(
    block_hashes: list[bytes], chunk_tokens: int, hash_block_size: int, max_tokens: int
) -> list[bytes]:
    """The hash of every whole chunk within the first ``max_tokens`` tokens.

    ``block_hashes[i]`` covers tokens ``[0, (i + 1) * hash_block_size)``; chunk ``c`` ends at
    token ``(c + 1) * chunk_tokens``, so its hash is block hash ``(c + 1) * per_chunk - 1``.
    """
    if chunk_tokens % hash_block_size:
        raise ValueError("chunk_tokens must be a multiple of the hash block size")
    per_chunk = chunk_tokens // hash_block_size
    n = min(max_tokens // chunk_tokens, len(block_hashes) // per_chunk)
    return [bytes(block_hashes[(c + 1) * per_chunk - 1]) for c in range(n)]


def lookup_keys(ns_digest: bytes, hashes: list[bytes], ranks: int) -> list[bytes]:
    """Keys for one LOOKUP covering every rank, chunk-major.

    LOOKUP counts present keys from the first up to the first miss, so ``count // ranks`` is the
    number of leading chunks that every rank can load.
    """
    return [chunk_key(ns_digest, h, r) for h in hashes for r in range(ranks)]
