"""Layout detection and KV format verdicts on real torch tensors and real vLLM spec objects.

These layouts cannot all run on this CPU (FlashAttention, MLA, DSA indexers, fp8 variants), so
the tensors here have the shapes, dtypes and strides those backends hand to ``register_kv_caches``
(research, vllm-connector.md §7), and the round trips check the exact bytes.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from connector_kit import engine_facts, worker_half

from infera.engine.vllm import compat
from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.half import WorkerHalf
from infera.engine.vllm.worker.layout import KVLayout, LayoutError, layer_blocks

B = 6  # blocks


def names(n: int) -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(n)]


def reference(caches: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """The documented payload: [layer (natural order)][block][page], built the slow way."""
    parts = []
    for name in sorted(caches, key=lambda n: int(n.split(".")[2])):
        t = caches[name]
        for b in ids:
            block = t[b]
            # the page is the block's bytes in memory order, whatever the logical order
            order = sorted(range(block.dim()), key=lambda i: -block.stride(i))
            parts.append(block.permute(order).contiguous().view(torch.uint8).flatten())
    return torch.cat(parts)


def round_trip(caches: dict[str, torch.Tensor], num_blocks: int | None = B) -> KVLayout:
    layout = KVLayout.from_caches(caches, num_blocks)
    ids = [4, 1, 5]
    out = torch.empty(layout.chunk_bytes(len(ids)), dtype=torch.uint8)
    layout.gather(ids, out)
    assert torch.equal(out, reference(caches, ids))
    before = {n: t.clone() for n, t in caches.items()}
    for t in caches.values():
        t.zero_()
    layout.scatter(ids, out, skip=1)
    for n, t in caches.items():
        assert torch.equal(t[[1, 5]], before[n][[1, 5]]), "loaded blocks are restored"
        assert not t[4].any(), "skipped blocks are left alone"
        assert not t[[0, 2, 3]].any(), "other blocks are untouched"
    return layout


def rand(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    if dtype == torch.uint8:
        return torch.randint(1, 255, shape, dtype=torch.uint8)
    return (torch.randn(*shape) + 3).to(dtype)


def test_vllm_029_one_buffer_is_one_gather_per_chunk() -> None:
    buf = rand(3, B, 2, 16, 128)  # [L, B, H, N, C]: LBHNC, the CPU backend's layout on 0.29+
    layout = round_trip({n: buf[i] for i, n in enumerate(names(3))})
    assert layout.batched
    assert layout.block_bytes == 3 * 2 * 16 * 128 * 2


def test_vllm_026_cpu_separate_tensors() -> None:
    layout = round_trip({n: rand(B, 2, 16, 128) for n in names(2)})
    assert not layout.batched


def test_vllm_026_flash_attention_token_major_storage() -> None:
    phys = [rand(B, 16, 2, 128) for _ in range(2)]  # [B, N, H, 2D] in memory, seen as [B, H, N, 2D]
    caches = {n: p.permute(0, 2, 1, 3) for n, p in zip(names(2), phys, strict=True)}
    round_trip(caches)
    assert "order(0, 2, 1, 3)" in layer_blocks("x", caches[names(2)[0]], B).describe


def test_block_major_cross_layer_buffer() -> None:
    buf = rand(B, 2, 2, 16, 64)  # BLHNC: a block holds every layer
    layout = round_trip({n: buf[:, i] for i, n in enumerate(names(2))})
    assert layout.batched


def test_padded_pages() -> None:
    """Pages padded to a larger block stride (``page_size_padded``): only the KV bytes travel."""
    elems, pad = 2 * 16 * 64, 256  # bf16 elements per page, padding elements per block
    raw = torch.zeros(2 * B * (elems + pad), dtype=torch.bfloat16)
    caches = {}
    for i, n in enumerate(names(2)):
        t = raw.as_strided((B, 2, 16, 64), (elems + pad, 16 * 64, 64, 1), i * B * (elems + pad))
        t.copy_(rand(B, 2, 16, 64))
        caches[n] = t
    layout = round_trip(caches)
    assert layout.block_bytes == 2 * elems * 2
    assert not raw.view(-1, elems + pad)[:, elems:].any(), "padding is never written"


def test_mla_latent_and_dsa_indexer_travel_together() -> None:
    caches = {f"model.layers.{i}.self_attn.attn": rand(B, 1, 16, 576, dtype=torch.uint8) for i in range(2)}
    caches.update(
        {
            f"model.layers.{i}.self_attn.indexer.k_cache": rand(B, 1, 16, 132, dtype=torch.uint8)
            for i in range(2)
        }
    )
    layout = KVLayout.from_caches(caches, B)
    assert layout.block_bytes == 2 * 16 * 576 + 2 * 16 * 132
    assert [lb.name for lb in layout.layers][:2] == [
        "model.layers.0.self_attn.attn",
        "model.layers.0.self_attn.indexer.k_cache",
    ]
    out = torch.empty(layout.chunk_bytes(2), dtype=torch.uint8)
    layout.gather([3, 0], out)
    for t in caches.values():
        t.zero_()
    layout.scatter([3, 0], out)
    assert all(t[[3, 0]].all() for t in caches.values()), "latent and indexer are both restored"


def test_mla_026_three_dimensional() -> None:
    round_trip({n: rand(B, 16, 576) for n in names(2)})


def test_kernel_blocks_group_into_engine_blocks() -> None:
    buf = rand(2, 2 * B, 2, 8, 64)  # each engine block is two adjacent kernel blocks
    layout = round_trip_kernel({n: buf[i] for i, n in enumerate(names(2))})
    assert layout.block_bytes == 2 * (2 * 2 * 8 * 64 * 2)


def round_trip_kernel(caches: dict[str, torch.Tensor]) -> KVLayout:
    layout = KVLayout.from_caches(caches, B)
    out = torch.empty(layout.chunk_bytes(1), dtype=torch.uint8)
    layout.gather([2], out)
    expect = torch.cat([t[4:6].contiguous().view(torch.uint8).flatten() for t in caches.values()])
    assert torch.equal(out, expect)
    return layout


def test_unsafe_layouts_are_refused() -> None:
    half = rand(B, 2, 16, 128)[..., :64]  # K only: a block is not one byte range
    with pytest.raises(LayoutError, match="not one byte range"):
        layer_blocks("k-only", half, B)
    with pytest.raises(LayoutError, match="do not split"):
        layer_blocks("odd", rand(7, 2, 16, 8), B)
    layout = KVLayout.from_caches({n: rand(B, 2, 16, 8) for n in names(2)}, B)
    with pytest.raises(LayoutError, match="outside"):
        layout.gather([B], torch.empty(layout.chunk_bytes(1), dtype=torch.uint8))
    with pytest.raises(LayoutError, match="expected"):
        layout.scatter([0], torch.empty(layout.chunk_bytes(1) - 1, dtype=torch.uint8))


def test_vllm_spec_verdicts() -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode, MambaSpec, MLAAttentionSpec

    vc = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"))
    cases = {
        "paged": FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16),
        "mla": MLAAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=576, dtype=torch.uint8, cache_dtype_str="fp8"
        ),
        "ds_mla": MLAAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=656, dtype=torch.uint8, cache_dtype_str="fp8_ds_mla"
        ),
        "per_token_head": FullAttentionSpec(
            block_size=16,
            num_kv_heads=2,
            head_size=64,
            dtype=torch.uint8,
            kv_quant_mode=KVQuantMode.FP8_PER_TOKEN_HEAD,
        ),
        "mamba": MambaSpec(block_size=16, shapes=((2, 3),), dtypes=(torch.float32,)),
    }
    got = {k: compat.classify_spec(k, s, vc) for k, s in cases.items()}
    assert {k: f.offload for k, f in got.items()} == {
        "paged": True,
        "mla": True,
        "ds_mla": False,
        "per_token_head": False,
        "mamba": False,
    }
    assert got["ds_mla"].kind == "packed"


FACTS = engine_facts(head_size=64)


def worker(blockers: list, sock: str = "/nonexistent/kvd.sock") -> WorkerHalf:
    return worker_half(FACTS, 32, sock, B, env=ConnectorEnv(), blockers=blockers)


def test_skipped_layer_turns_offload_off_and_loads_become_recomputes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from infera.engine.vllm.formats import classify

    packed = classify(
        "model.layers.1.self_attn.attn",
        attention=True,
        use_mla=True,
        cache_dtype="fp8_ds_mla",
        token_bytes=656,
    )
    w = worker([packed])
    with caplog.at_level(logging.WARNING, logger="infera.engine.vllm"):
        w.register({n: rand(B, 1, 16, 656, dtype=torch.uint8) for n in names(2)})
    assert any(
        r.getMessage().startswith("register_kv_caches: layer model.layers.1.self_attn.attn")
        and r.getMessage().endswith("SKIPS it")
        for r in caplog.records
    )
    assert w.layout is None
    meta = InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(b"h" * 32, [0, 1], skip=1)])])
    w.load(meta)
    assert w.take_load_errors() == {1}, "vLLM recomputes what could not be loaded"
    w.save(InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(b"h" * 32, [0, 1])])]))  # nothing raises


def test_worker_without_daemon_reports_load_errors() -> None:
    w = worker([])
    w.register({n: rand(B, 2, 16, 64) for n in names(2)})
    assert w.layout is not None
    w.load(
        InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(b"h" * 32, [2, 3]), ChunkJob(b"i" * 32, [4, 5])])])
    )
    assert w.take_load_errors() == {2, 3, 4, 5}
    assert w.take_load_errors() == set()


@pytest.mark.parametrize("stacked", [True, False])
def test_scatter_of_consecutive_block_runs(stacked: bool) -> None:
    if stacked:
        buf = rand(2, B, 2, 4, 8)
        caches = {n: buf[i] for i, n in enumerate(names(2))}
    else:
        caches = {n: rand(B, 2, 4, 8) for n in names(2)}
    layout = KVLayout.from_caches(caches, B)
    assert layout.batched is stacked
    ids = [2, 3, 4, 0, 1]
    out = torch.empty(layout.chunk_bytes(len(ids)), dtype=torch.uint8)
    layout.gather(ids, out)
    before = {n: t.clone() for n, t in caches.items()}
    for t in caches.values():
        t.zero_()
    layout.scatter(ids, out, skip=1, stop=4)  # blocks 3, 4 (one run) and 0
    for n, t in caches.items():
        assert torch.equal(t[[3, 4, 0]], before[n][[3, 4, 0]])
        assert not t[[1, 2, 5]].any()
