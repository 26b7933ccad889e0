"""Which KV cache formats the connector offloads, decided per layer from plain facts.

Chunks are raw bytes: a layer is offloaded only when its pages hold nothing but KV values whose
meaning does not depend on anything outside the page (a per-tensor fp8 scale from the checkpoint
is fine; scales packed into the page next to the values are not, because the raw-byte gather has
no notion of where they sit). The product doc's "Supported KV formats" section is the contract.

A hit needs every layer of the model, so one skipped layer turns offload off for the whole
engine; the engine keeps serving by recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN_DTYPES = {
    "auto",
    "bfloat16",
    "float16",
    "half",
    "float32",
    "float",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
}
# kv_cache_dtype values whose pages interleave scales with the values.
PACKED_DTYPES = {
    "fp8_ds_mla",
    "nvfp4",
    "nvfp4_ds_mla",
    "fp8_per_token_head",
    "int8_per_token_head",
    "int4_per_token_head",
}
# Bytes per token of known scale-packed MLA latents (DeepSeek V3.2 656, V4 584, V4.1 528, nvfp4 352).
PACKED_MLA_TOKEN_BYTES = {656, 584, 528, 352}
PLAIN_QUANT_MODES = {"NONE", "FP8_PER_TENSOR"}
MLA_LATENT = 576
INDEXER_TOKEN_BYTES = 132


@dataclass(frozen=True)
class LayerFormat:
    """The verdict for one layer: ``offload`` or not, and why (for the log line)."""

    name: str
    offload: bool
    kind: str
    reason: str = ""


def classify(
    name: str,
    *,
    attention: bool,
    use_mla: bool,
    cache_dtype: str,
    quant_mode: str = "NONE",
    token_bytes: int | None = None,
    head_size: int | None = None,
    indexer: bool = False,
) -> LayerFormat:
    """Classify one layer. ``token_bytes`` is the page bytes per token per head slot."""
    dtype = (cache_dtype or "auto").lower()
    if not attention:
        return LayerFormat(name, False, "state", "not a paged attention cache (recurrent or other state)")
    if indexer or name.endswith("indexer.k_cache"):
        if token_bytes in (None, INDEXER_TOKEN_BYTES):
            return LayerFormat(name, True, "dsa-indexer")
        return LayerFormat(
            name, False, "dsa-indexer", f"unexpected indexer page of {token_bytes} bytes/token"
        )
    if dtype in PACKED_DTYPES or (quant_mode or "NONE") not in PLAIN_QUANT_MODES:
        why = dtype if dtype in PACKED_DTYPES else f"quantization mode {quant_mode}"
        return LayerFormat(name, False, "packed", f"{why} packs scales into the page")
    if use_mla:
        if token_bytes in PACKED_MLA_TOKEN_BYTES:
            return LayerFormat(name, False, "packed", f"{token_bytes}-byte latent interleaves tile scales")
        if head_size not in (None, MLA_LATENT):
            return LayerFormat(name, False, "mla", f"MLA head size {head_size} is not the plain 576 latent")
        return LayerFormat(name, True, "mla")
    if dtype not in PLAIN_DTYPES:
        return LayerFormat(
            name, False, "unknown", f"kv cache dtype {cache_dtype!r} is not a known plain format"
        )
    return LayerFormat(name, True, "paged")


def skip_message(fmt: LayerFormat) -> str:
    """The per-layer warning users grep for (product doc: ``register_kv_caches: … SKIPS it``)."""
    return f"register_kv_caches: layer {fmt.name} is {fmt.kind} ({fmt.reason}); infera-kvd SKIPS it"
