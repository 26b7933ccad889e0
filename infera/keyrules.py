"""Key compatibility, written once: when two engines' chunk keys can meet, and what auto picks.

Everything here decides whether chunks stored by one engine are found by another (architecture
decision 4), and every part of the project that has an opinion about it asks this module:

* the connector (:mod:`infera.engine.vllm.keys`, ``config``, ``compat``): the ``auto`` chunk size,
  how ``INFERA_KVD_CHUNK_TOKENS`` is read, the hash-seed mode it declares at HELLO;
* ``kvd doctor`` (checks ``chunk-tokens`` and ``hash-settings``) and ``kvd lint`` (KVD301, KVD303,
  KVD408): the same reading of the same variables, the same idea of a small chunk, the same seed rule;
* the daemon (:mod:`infera.kvd.snapshot`): the STATS warning when engines of one model declare
  different hash fingerprints.

Part of the contract layer (docs/design.md, "Layers"): plain Python, no vLLM or torch, nothing of ours
but other contract modules. The facts behind the seed rule are in the research notes
(vllm-connector.md, "NONE_HASH seeding").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from infera.errors import UsageError
from infera.versions import vstr

CHUNK_TOKENS_ENV = "INFERA_KVD_CHUNK_TOKENS"
AIS_ENV = "INFERA_KVD_AIS"
ROOTS_ENV = "INFERA_KVD_HIPFILE_ROOTS"
SEED_ENV = "PYTHONHASHSEED"
HASH_ALGO_FLAG = "--prefix-caching-hash-algo"
DEFAULT_HASH_ALGO = "sha256"

# ---------------------------------------------------------------------------------------------
# Chunk size (docs/connector.md has the table). Small chunks on the RAM path so short prompts
# still fill whole chunks, large ones where GPU-direct reads need size to pay off.

RAM_TARGET_BYTES = 4 << 20
RAM_MAX_TOKENS = 256
GPU_DIRECT_MIN_BYTES = 128 << 20
#: The most KV one token takes on one rank in the models we size chunks for. At bf16 on one GPU,
#: Llama-2-13B (full multi-head attention) takes 0.78 MiB and Llama-3.1-405B 0.49 MiB; GQA, MLA, fp8
#: and tensor parallelism only make it smaller.
MAX_KV_BYTES_PER_TOKEN = 1 << 20
#: A fixed chunk below this many tokens is small for GPU-direct reads whatever the model: even at
#: :data:`MAX_KV_BYTES_PER_TOKEN` it stays under :data:`GPU_DIRECT_MIN_BYTES`, and ``auto`` never
#: picks fewer tokens there (it picks at least ``GPU_DIRECT_MIN_BYTES / bytes_per_token``).
SMALL_GPU_DIRECT_TOKENS = GPU_DIRECT_MIN_BYTES // MAX_KV_BYTES_PER_TOKEN


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


def parse_chunk_tokens(text: str | None) -> int | None:
    """``INFERA_KVD_CHUNK_TOKENS``: ``auto`` (or unset, or empty) gives None; otherwise a positive integer.

    This is how the connector reads it, so a value this refuses makes the connector refuse to start.
    """
    if text is None or text.strip().lower() in ("", "auto"):
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(
            f"{CHUNK_TOKENS_ENV}={text!r} is neither 'auto' nor a whole number",
            hint="leave it unset (auto) unless you measured a better value",
        ) from None
    if value <= 0:
        raise UsageError(f"{CHUNK_TOKENS_ENV} must be positive (got {value})")
    return value


def gpu_direct_requested(ais: str, has_roots: bool) -> bool:
    """Whether ``auto`` sizes chunks for GPU-direct: ``INFERA_KVD_AIS=1``, or ``auto`` with roots set."""
    return ais == "1" or (ais == "auto" and has_roots)


def gpu_direct_in_env(ais: str | None, roots: str | None) -> bool | None:
    """:func:`gpu_direct_requested` from raw variable text, as a tool reads it; None for an AIS value
    the connector refuses (the tool reports that on its own)."""
    value = (ais or "0").strip().lower()
    if value not in ("0", "1", "auto"):
        return None
    return gpu_direct_requested(value, any(item.strip() for item in (roots or "").split(",")))


def small_chunk(tokens: int, gpu_direct: bool | None) -> str | None:
    """Why a fixed chunk of ``tokens`` is small, or None; never says so of a value ``auto`` picks.

    Only GPU-direct has a floor without knowing the model: below :data:`SMALL_GPU_DIRECT_TOKENS`
    a chunk is under 128 MiB for every model. On the RAM path ``auto`` itself picks anything from
    one block (large models) to 256 tokens (small ones), so no token count is small there without
    the model's KV bytes per token, which neither kvd doctor nor kvd lint can see.
    """
    if gpu_direct and tokens < SMALL_GPU_DIRECT_TOKENS:
        return (
            f"with GPU-direct reads on, a chunk of {tokens} tokens stays under the "
            f"{GPU_DIRECT_MIN_BYTES >> 20} MiB auto sizes chunks to, for any model, so reloads are "
            "overhead-bound and can lose to recompute"
        )
    return None


def chunk_never_hits(chunk_tokens: int, max_model_len: int | None) -> str | None:
    """Why chunks of ``chunk_tokens`` tokens never give a hit on an engine whose prompts hold at most
    ``max_model_len`` tokens, or None. A chunk is stored once a prompt holds all of its tokens, and
    loaded only for a prompt with at least one token more (vLLM computes the last token itself)."""
    if not max_model_len or chunk_tokens < max_model_len:
        return None
    return (
        f"a chunk is {chunk_tokens} tokens but max_model_len is {max_model_len}: no prompt holds a "
        "whole chunk and one token more, so every request misses"
    )


@dataclass(frozen=True)
class ChunkSetting:
    """One process's ``INFERA_KVD_CHUNK_TOKENS`` as the connector will take it.

    ``tokens`` is None for auto; ``error`` says why the connector refuses the value; ``small`` says
    why a fixed value is small (a warning), both None when there is nothing to say.
    """

    tokens: int | None
    error: str | None = None
    small: str | None = None

    @property
    def auto(self) -> bool:
        return self.tokens is None and self.error is None


def chunk_setting(text: str | None, ais: str | None = None, roots: str | None = None) -> ChunkSetting:
    """Judge ``INFERA_KVD_CHUNK_TOKENS`` (with the process's ``INFERA_KVD_AIS`` and roots): the one
    verdict kvd doctor and kvd lint both report."""
    try:
        tokens = parse_chunk_tokens(text)
    except UsageError as err:
        return ChunkSetting(None, error=err.message)
    if tokens is None:
        return ChunkSetting(None)
    return ChunkSetting(tokens, small=small_chunk(tokens, gpu_direct_in_env(ais, roots)))


# ---------------------------------------------------------------------------------------------
# Hash seeds: two processes derive the same block hashes, and so the same kvd keys, only with the
# same PYTHONHASHSEED on both, or unset on both with vLLM >= 0.29 and a sha256 hash algorithm.

#: From this vLLM release on, an unset PYTHONHASHSEED seeds sha256 hash chains with a constant.
FIXED_SEED_FROM = (0, 29)
#: Hash algorithms that get the constant seed; xxhash ones draw a random seed per process.
SEEDED_ALGOS = ("sha256", "sha256_cbor")
_MAX_SEED = 4294967295

C = TypeVar("C", bound=Mapping[str, Any])


def fixed_seed_release(version: Sequence[int] | None) -> bool | None:
    """Whether this vLLM version seeds sha256 chains with a constant; None when the version is unknown."""
    return None if version is None else tuple(version[:2]) >= FIXED_SEED_FROM


def hash_seed_mode(python_hash_seed: str | None, algo: str, fixed_seed_release: bool | None) -> str:
    """How vLLM seeds its block-hash chain in a process.

    ``env:<value>`` when PYTHONHASHSEED is set (vLLM hashes the value itself, ``random`` included);
    ``fixed`` where an unset variable gets the constant seed (``fixed_seed_release`` and a
    :data:`SEEDED_ALGOS` algorithm); ``random`` when the seed is drawn per process (keys then never
    match elsewhere); ``unknown`` when that depends on a vLLM version nobody knows.
    """
    if python_hash_seed is not None:
        return f"env:{python_hash_seed}"
    if algo not in SEEDED_ALGOS:
        return "random"
    if fixed_seed_release is None:
        return "unknown"
    return "fixed" if fixed_seed_release else "random"


def random_seed_reason(algo: str, version: Sequence[int] | None) -> str:
    """Why an unset PYTHONHASHSEED gives this process a random seed (mode ``random``)."""
    if version is not None and not fixed_seed_release(version):
        return f"vLLM {vstr(tuple(version[:3]))} draws a random seed per process when {SEED_ENV} is unset"
    return f"hash algorithm {algo} draws a random seed per process when {SEED_ENV} is unset"


def python_hash_seed(value: str | None) -> int | None:
    """The seed CPython takes from ``PYTHONHASHSEED``: a number, or None for a random one.

    CPython (``config_init_hash_seed`` in Python/initconfig.c) treats an unset or empty variable and
    the exact text ``random`` as "random"; anything else goes through C ``strtoul(text, &end, 10)``,
    which must use up the whole text: leading whitespace (space, tab, newline, ``\\v``, ``\\f``,
    ``\\r``), then one optional ``+`` or ``-``, then decimal digits (leading zeros are fine), nothing
    after them, and at most 4294967295. A minus sign wraps the number round to a huge one, so only
    ``-0`` passes. Raises ValueError saying why CPython refuses to start with ``value``.

    vLLM reads the variable on its own and seeds its block hashes from the text, not from this
    number (see :func:`hash_seed_mode`): ``' 0'`` and ``0`` are the same seed to Python, not to vLLM.
    """
    if not value or value == "random":
        return None
    rest = value.lstrip(" \t\n\v\f\r")
    negative = rest.startswith("-")
    if rest[:1] in ("+", "-"):
        rest = rest[1:]
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if not digits:
        hint = " (it is lower-case and exact)" if value.strip().lower() == "random" else ""
        raise ValueError(f"is neither 'random'{hint} nor a decimal number")
    if rest[digits:]:
        raise ValueError(f"has {rest[digits:]!r} after the number")
    number = int(rest[:digits])
    if negative and number:
        raise ValueError("is negative")
    if number > _MAX_SEED:
        raise ValueError(f"is above {_MAX_SEED}")
    return number


def fingerprint_conflicts(clients: Iterable[C]) -> list[tuple[str, dict[str, list[C]]]]:
    """Models whose clients declared more than one hash fingerprint at HELLO, sorted by model.

    Each entry is ``(model, {fingerprint: [clients]})``, fingerprints sorted. Clients that declare no
    model or no fingerprint (tools, plain scripts) are not compared.
    """
    by_model: dict[str, dict[str, list[C]]] = {}
    for c in clients:
        model, fp = c.get("model"), c.get("hash_fingerprint")
        if model and fp:
            by_model.setdefault(str(model), {}).setdefault(str(fp), []).append(c)
    return [(model, dict(sorted(fps.items()))) for model, fps in sorted(by_model.items()) if len(fps) > 1]
