"""The GPU copy path on a real CUDA/ROCm device: skipped where torch or a GPU is missing (CI).

What only a GPU can show: the copies are really asynchronous, so the stream ordering must hold
(a save's gather sees the KV the forward wrote, and the next step cannot overwrite blocks before
the gather read them; a load's scatter lands before the next kernel on the compute stream), the
arena registration works on a memfd mapping from the daemon, and the GPU checksum equals the
CPU one. Run on the H200 machine (docs/benchmarks.md, "GPU data path").
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA/ROCm device", allow_module_level=True)

from connector_kit import engine_facts, worker_half  # noqa: E402

from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob  # noqa: E402
from infera.engine.vllm.worker.gpu.copier import ArenaPin, GpuCopier, LoadItem, SaveItem  # noqa: E402
from infera.engine.vllm.worker.gpu.gdfiles import gpu_wsum31  # noqa: E402
from infera.engine.vllm.worker.layout import KVLayout  # noqa: E402
from infera.kvd import chunkfile as cf  # noqa: E402

DEV = torch.device("cuda")
B = 64


def caches(layout: str, L: int = 8, H: int = 4, N: int = 16, D: int = 64) -> dict[str, Any]:
    if layout == "0.26":
        return {
            f"model.layers.{i}.attn": torch.randn(B, N, H, 2 * D, device=DEV)
            .to(torch.bfloat16)
            .permute(0, 2, 1, 3)
            for i in range(L)
        }
    buf = torch.randn(L, B, N, H, 2 * D, device=DEV).to(torch.bfloat16)
    return {f"model.layers.{i}.attn": buf[i].permute(0, 2, 1, 3) for i in range(L)}


@pytest.mark.parametrize("layout", ["0.26", "0.29"])
@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_round_trip_on_the_gpu(layout: str, pinned: bool, kernel: str) -> None:
    kv = caches(layout)
    lay = KVLayout.from_caches(kv, B)
    bpc = 2
    cb = lay.chunk_bytes(bpc)
    copier = GpuCopier(lay, bpc, staging_bytes=6 * cb, kernel_mode=kernel)
    # auto compiles the Triton page kernel for separate per-layer tensors (vLLM 0.26); a GPU
    # machine without a working Triton fails here rather than silently measuring the torch path
    want = "triton" if (kernel, layout) == ("auto", "0.26") else "torch"
    assert copier.copy_kernel == want, copier.kernel_why
    arena = torch.zeros(cb * 24, dtype=torch.uint8)
    pin = ArenaPin(enabled=pinned)
    pin.attach(arena)
    assert pin.pinned == pinned, pin.error
    src = [[2 * i, 2 * i + 1] for i in range(10)]
    saves = [SaveItem(ids, (i + 1) * cb, cb, i) for i, ids in enumerate(src)]
    sealed: list[int] = []
    copier.save(saves, arena, sealed.extend)
    copier.drain()
    assert sealed == list(range(10))
    for it in saves:
        ref = torch.empty(cb, dtype=torch.uint8, device=DEV)
        lay.gather(it.block_ids, ref)
        assert torch.equal(arena[it.offset : it.offset + cb], ref.cpu())
    dst = [[40 + 2 * i, 41 + 2 * i] for i in range(10)]
    done: list[int] = []
    copier.load(
        [LoadItem(d, 0, 2, saves[i].offset, cb) for i, d in enumerate(dst)], arena, lambda: done.append(1)
    )
    torch.cuda.current_stream().synchronize()  # the scatter is on the compute stream
    for t in kv.values():
        assert torch.equal(t[[b for d in dst for b in d]], t[[b for s in src for b in s]])
    copier.drain()
    assert done == [1]
    # a partial load (skip the first block of one chunk, stop early in another) leaves the
    # skipped blocks alone
    before = {n: t.clone() for n, t in kv.items()}
    part = [LoadItem([50, 51], 1, 2, saves[0].offset, cb), LoadItem([52, 53], 0, 1, saves[3].offset, cb)]
    copier.load(part, arena, lambda: done.append(2))
    torch.cuda.current_stream().synchronize()
    copier.drain()
    for n, t in kv.items():
        assert torch.equal(t[50], before[n][50]) and torch.equal(t[53], before[n][53])
        assert torch.equal(t[51], before[n][1]) and torch.equal(t[52], before[n][6])
    pin.detach()


def test_save_sees_the_forward_and_the_next_step_waits_for_the_gather() -> None:
    kv = caches("0.26", L=4)
    lay = KVLayout.from_caches(kv, B)
    copier = GpuCopier(lay, 2, staging_bytes=64 << 20)
    cb = copier.chunk_bytes
    arena = torch.zeros(cb * 40, dtype=torch.uint8)
    pin = ArenaPin()
    pin.attach(arena)
    t0 = next(iter(kv.values()))
    ids = [[2 * i, 2 * i + 1] for i in range(32)]
    torch.cuda._sleep(50_000_000)  # a long "forward" still running on the compute stream...
    for t in kv.values():
        t[:64].fill_(3.0)  # ...that writes the KV the save must see
    copier.save([SaveItem(b, i * cb, cb, i) for i, b in enumerate(ids)], arena, lambda toks: None)
    copier.before_forward()  # next step
    for t in kv.values():
        t[:64].fill_(-1.0)  # would corrupt the saved chunks if it ran before the gather
    copier.drain()
    assert bool((t0[:64] == -1.0).all())
    payload = arena[: 32 * cb].view(torch.bfloat16)
    assert bool((payload == 3.0).all()), "every saved byte is the forward's, none the next step's"
    pin.detach()


def test_gpu_checksum_equals_the_cpu_one() -> None:
    for n in (4096, (1 << 18) + 6, 17 << 20):
        data = torch.randint(0, 256, (n,), dtype=torch.uint8, device=DEV)
        assert gpu_wsum31(data) == cf.wsum31(data.cpu().numpy().tobytes())


FACTS = engine_facts(
    model="/m/gpu", num_layers=8, kv_heads=4, head_size=64, vllm_version="0.26", platform="cuda"
)


def test_worker_registers_the_daemon_arena_and_round_trips(daemon: Any) -> None:
    w = worker_half(FACTS, 32, daemon.socket, B)
    kv = caches("0.26")
    w.register(kv)
    assert w.gpu is not None and w.pin.pinned, w.pin.error
    hashes = [os.urandom(16) for _ in range(8)]
    src = [[2 * i, 2 * i + 1] for i in range(8)]
    w.save(
        InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(h, s) for h, s in zip(hashes, src, strict=True)])])
    )
    w.gpu.drain()
    w.link.client().ping()
    dst = [[32 + 2 * i, 33 + 2 * i] for i in range(8)]
    w.load(
        InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(h, d) for h, d in zip(hashes, dst, strict=True)])])
    )
    torch.cuda.synchronize()
    assert not w.take_load_errors()
    for t in kv.values():
        assert torch.equal(t[[b for d in dst for b in d]], t[[b for s in src for b in s]])
    fields = w.report_fields()
    assert fields["data_path"] == "arena-pinned" and not fields["fallback"]
    w.close()


@pytest.mark.parametrize("layout", ["0.26", "0.29"])
@pytest.mark.parametrize("slabs", [2, 64])
def test_layerwise_load_lands_each_layer_behind_its_own_dma(layout: str, slabs: int) -> None:
    """The real 2D DMAs (cudaMemcpy2DAsync from a registered arena) through a ring of slabs: the
    bytes equal a whole-step load's, and a kernel queued on the compute stream after layer ``l``'s
    wait already sees layer ``l`` (and nothing of the layers after it)."""
    from infera.engine.vllm.worker.gpu.layerwise_gpu import GpuLayerwise
    from infera.engine.vllm.worker.gpu.rows import row_copier

    src = caches(layout)
    lay = KVLayout.from_caches(src, B)
    names = [lb.name for lb in lay.layers]
    bpc = 2
    cb = lay.chunk_bytes(bpc)
    n = 20
    arena = torch.zeros(cb * (n + 4), dtype=torch.uint8)
    pin = ArenaPin()
    pin.attach(arena)
    assert pin.pinned, pin.error
    cells = list(range(n))
    cells[5], cells[6] = 17, 3  # two runs broken
    for i, c in enumerate(cells):
        staged = torch.empty(cb, dtype=torch.uint8, device=DEV)
        lay.gather([2 * i, 2 * i + 1], staged)
        arena[c * cb : (c + 1) * cb].copy_(staged.cpu())
    dst_ids = [[63 - 2 * i, 62 - 2 * i] for i in range(n)]
    items = [LoadItem(d, 0, bpc, c * cb, cb) for d, c in zip(dst_ids, cells, strict=True)]
    want = caches(layout)
    for t in want.values():
        t.zero_()
    whole = GpuCopier(KVLayout.from_caches(want, B), bpc, staging_bytes=8 * cb)
    whole.load(items, arena, lambda: None)
    whole.drain()
    got = caches(layout)
    for t in got.values():
        t.zero_()
    gpu = GpuCopier(KVLayout.from_caches(got, B), bpc, staging_bytes=8 * cb)
    rows, how = row_copier(DEV)
    assert rows is not None, how
    released: list[int] = []
    lw = GpuLayerwise(gpu, rows, Counter(), lambda ids: None)
    gpu.load_pool.buf = torch.empty(slabs * lw.slab_bytes(n), dtype=torch.uint8, device=DEV)
    lw.start(items, arena, lambda: released.append(1))
    seen = []
    for i, name in enumerate(names):
        lw.wait(name)
        # queued on the compute stream, as the layer's attention would be
        seen.append([got[m].float().abs().sum() for m in names[i : i + 2]])
    gpu.drain()
    torch.cuda.synchronize()
    assert released == [1]
    for name in names:
        assert torch.equal(got[name], want[name]), name
    for i, sums in enumerate(seen):
        assert float(sums[0]) == float(want[names[i]].float().abs().sum()), "layer i landed before it ran"
        assert len(sums) == 1 or float(sums[1]) == 0.0, "layer i+1 lands only at its own wait"
    # the step measured the rates the whole-step rule weighs (warm-up defaults before)
    from infera.engine.vllm.worker.gpu.layerwise_gpu import CALL_S, DMA_GBPS, LAYER_S

    assert lw.call_s != CALL_S and 0 < lw.call_s < 1e-3, lw.call_s
    assert lw.layer_s != LAYER_S and 0 < lw.layer_s < 0.1, lw.layer_s
    assert lw.dma_gbps != DMA_GBPS and lw.dma_gbps > 0, lw.dma_gbps
    # the step's trace, read off the GPU's own events once the forward (here: the sums) ended
    c = lw.counters
    assert c["load_lw_traced_steps"] == 0, "the trace ends with the step, not with the last layer"
    lw.trace.end()
    gpu.drain()
    assert c["load_lw_traced_steps"] == 1
    assert 0 <= c["load_lw_dma_begin_us"] < c["load_lw_dma_end_us"] <= c["load_lw_gpu_us"], c
    assert c["load_lw_cpu_first_wait_us"] <= c["load_lw_cpu_us"], c
    print(
        f"layer-wise step: {lw.call_s * 1e6:.1f} us of CPU per row copy, {lw.layer_s * 1e6:.1f} us per "
        f"layer's wait, DMA {lw.dma_gbps:.1f} GB/s (EWMA)"
    )
    pin.detach()
