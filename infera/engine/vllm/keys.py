"""Chunk size, namespace, hash settings and chunk keys (architecture decision 4).

Pure functions over plain facts, shared by the scheduler half, the worker half and the prewarm
route, so the three can never derive different keys. Nothing here imports vLLM; ``compat``
turns a ``VllmConfig`` into :class:`EngineFacts`. The rules kvd doctor and kvd lint apply too
(the ``auto`` chunk size, the hash-seed mode) live in :mod:`infera.keyrules` and are re-exported here.

* A *chunk* is ``chunk_tokens`` consecutive prompt tokens, a whole number of vLLM blocks.
* A chunk's *hash* is vLLM's block hash of its last block: the chain hash already covers the
  whole prefix up to there.
* A chunk's *key* is ``blake2b(namespace digest, rank, chunk hash[, group tag])``; every rank of a
  tensor/pipeline-parallel engine stores its own shard under its own key, and every KV cache
  group of a hybrid model its own blocks (``groups.py`` says which).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from infera.keyrules import auto_chunk_tokens, hash_seed_mode, resolve_chunk_tokens

KEY_BYTES = 32
FORMAT_VERSION = 1


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
    #: fingerprint of the weight files (:mod:`infera.engine.vllm.weights`); "" where unknown (tests)
    weights: str = ""
    #: vLLM's weight quantization method ("" for none): it changes what the weights compute
    quantization: str = ""
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

    @property
    def weights(self) -> str:
        """The weights fingerprint this namespace covers ("" when none was taken)."""
        return str(self.description.get("weights") or "")


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
    # The weights fingerprint is in the digest; its first 8 digits are also in the name, so `kvd stat`,
    # `kvd top` and the disk tier's `namespace` files show which weights a namespace belongs to.
    weights = f"w:{facts.weights[:8]}/" if facts.weights else ""
    return Namespace(
        name=f"vllm/{label}/{weights}{digest.hex()}",
        digest=digest,
        chunk_tokens=chunk_tokens,
        hash_settings=settings,
        hash_fingerprint=fingerprint,
        description=description,
    )


def chunk_key(ns_digest: bytes, chunk_hash: bytes, rank: int = 0, group: bytes = b"") -> bytes:
    """The daemon key of one rank's shard of one chunk; ``group`` is the KV cache group's tag
    (:meth:`infera.engine.vllm.groups.Plan.tag`; empty for single-group engines, whose keys
    are the same as before groups existed)."""
    return chunk_keyer(ns_digest, rank, group)(chunk_hash)


def chunk_keyer(ns_digest: bytes, rank: int = 0, group: bytes = b"") -> Callable[[bytes], bytes]:
    """:func:`chunk_key` of one namespace, rank and group for many chunk hashes: the hash state
    of the common prefix is made once and copied per key. The key layout is written here only:
    blake2b over the namespace digest, the rank (4 bytes, big-endian), the chunk hash and, for a
    hybrid engine, ``\\x00group`` and the group's tag."""
    head = hashlib.blake2b(digest_size=KEY_BYTES)
    head.update(ns_digest)
    head.update(rank.to_bytes(4, "big"))
    tail = b"\x00group" + group if group else b""

    def key(chunk_hash: bytes) -> bytes:
        h = head.copy()
        h.update(bytes(chunk_hash))
        if tail:
            h.update(tail)
        return h.digest()

    return key


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


__all__ = [
    "FORMAT_VERSION",
    "KEY_BYTES",
    "EngineFacts",
    "Namespace",
    "auto_chunk_tokens",
    "chunk_hashes",
    "chunk_key",
    "chunk_keyer",
    "hash_seed_mode",
    "hash_settings_of",
    "make_namespace",
    "resolve_chunk_tokens",
]
