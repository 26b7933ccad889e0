"""Layer-wise loads on the GPU copy path, run on CPU tensors (synchronous streams, torch row copies):
each layer's pages land only when vLLM waits for that layer, byte for byte what a whole-step load
writes, through a ring of staging slabs smaller than the step; layers run without a wait become
load errors; the leases are released once, after the last DMA. The H200 run in
docs/benchmarks.md covers the real 2D DMAs and streams."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import torch
from connector_kit import engine_facts, worker_half
from test_gpu_path import LAYOUTS, B, gpu_worker, per_layer_nhd

from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.gpu.copier import GpuCopier, LoadItem
from infera.engine.vllm.worker.gpu.layerwise_gpu import GpuLayerwise, runs_of
from infera.engine.vllm.worker.gpu.rows import RowCopyError, check_rows, pick_runtime, torch_rows
from infera.engine.vllm.worker.layout import KVLayout

BPC = 2


def five_layers() -> dict[str, torch.Tensor]:
    return per_layer_nhd(L=5)


def staged(caches: dict[str, torch.Tensor], src: list[list[int]], offsets: list[int]) -> torch.Tensor:
    """An arena holding the payloads of ``src`` at ``offsets`` (chunk sized cells)."""
    layout = KVLayout.from_caches(caches, B)
    cb = layout.chunk_bytes(BPC)
    arena = torch.zeros(cb * (max(offsets) + 2), dtype=torch.uint8)
    for ids, cell in zip(src, offsets, strict=True):
        layout.gather(ids, arena[cell * cb : (cell + 1) * cb])
    return arena


# chunks 0-2 sit next to each other in the arena (one run), 3 and 4 do not; 2 and 4 are partial
SRC = [[3, 7], [8, 9], [1, 2], [20, 11], [12, 13]]
CELLS = [2, 3, 4, 9, 6]
DST = [[32, 33], [34, 35], [36, 37], [38, 39], [14, 15]]
SKIP_STOP = [(0, 2), (0, 2), (1, 2), (0, 2), (0, 1)]


def items(cb: int) -> list[LoadItem]:
    return [LoadItem(d, s, e, c * cb, cb) for d, (s, e), c in zip(DST, SKIP_STOP, CELLS, strict=True)]


def reference(name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor, int]:
    """(caches to load into, what a whole-step load leaves in them, the arena, chunk bytes)."""
    src = five_layers() if name == "0.26-nhd" else LAYOUTS[name]()
    arena = staged(src, SRC, CELLS)
    dst = {n: torch.zeros_like(t) for n, t in src.items()}
    want = {n: t.clone() for n, t in dst.items()}
    layout = KVLayout.from_caches(want, B)
    cb = layout.chunk_bytes(BPC)
    GpuCopier(layout, BPC, staging_bytes=4 * cb).load(items(cb), arena, lambda: None)
    return dst, want, arena, cb


def test_runs_of_joins_neighbours_in_order() -> None:
    assert runs_of(items(10), 10) == [(0, 3, 20), (3, 1, 90), (4, 1, 60)]


def test_rows_never_leave_a_tensor() -> None:
    t = torch.zeros(100, dtype=torch.uint8)
    check_rows(t, 10, 30, 10, 3, "t")  # last row ends at 80
    with pytest.raises(RowCopyError, match="leave"):
        check_rows(t, 10, 30, 10, 4, "t")
    with pytest.raises(RowCopyError, match="bad rows"):
        check_rows(t, 0, 5, 10, 1, "t")
    src = torch.arange(100, dtype=torch.uint8)
    torch_rows(t, 1, 4, src, 10, 20, 3, 2, None)
    assert t[:9].tolist() == [0, 10, 11, 12, 0, 30, 31, 32, 0]


# /proc/self/maps of a process with two CUDA runtimes loaded: a package's 12 before torch's 13
_MAPS = """\
7f0000000000-7f0000100000 r-xp 00000000 08:01 11 /opt/conda/lib/python3.12/site-packages/cupy_backends/libcudart.so.12.8.90
7f0000200000-7f0000300000 r-xp 00000000 08:01 12 /opt/conda/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13
7f0000400000-7f0000500000 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000600000-7f0000601000 rw-p 00000000 00:00 0 [heap]
"""


def test_the_row_copy_uses_the_runtime_torch_was_built_with() -> None:
    cu13 = "/opt/conda/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13"
    assert pick_runtime(_MAPS, "13.0") == (cu13, "cudaMemcpy2DAsync")
    assert pick_runtime(_MAPS, "12.8")[0].endswith("libcudart.so.12.8.90")  # type: ignore[index]
    # no version to go by, or none of that major version: the first by path, as before
    assert pick_runtime(_MAPS, None)[0].endswith("libcudart.so.12.8.90")  # type: ignore[index]
    assert pick_runtime(_MAPS, "11.8")[0].endswith("libcudart.so.12.8.90")  # type: ignore[index]
    hip = "7f00-7f01 r-xp 00000000 08:01 14 /opt/rocm/lib/libamdhip64.so.6.4.60400\n"
    assert pick_runtime(hip, "6.4.43482") == ("/opt/rocm/lib/libamdhip64.so.6.4.60400", "hipMemcpy2DAsync")
    assert pick_runtime("7f00-7f01 rw-p 00000000 00:00 0 [stack]\n", "13.0") is None


@pytest.mark.parametrize("name", ["0.26-nhd", "0.29-views", "dsa"])
@pytest.mark.parametrize("slabs", [2, 3, 16])
def test_each_layer_lands_when_waited_for(name: str, slabs: int) -> None:
    dst, want, arena, cb = reference(name)
    layout = KVLayout.from_caches(dst, B)
    names = [lb.name for lb in layout.layers]
    gpu = GpuCopier(layout, BPC, staging_bytes=4 * cb)
    counters: Counter[str] = Counter()
    failed: list[list[int]] = []
    lw = GpuLayerwise(gpu, torch_rows, counters, failed.append)
    its = items(cb)
    gpu.load_pool.buf = torch.empty(slabs * lw.slab_bytes(len(its)), dtype=torch.uint8)
    assert lw.fits(len(its))
    released: list[int] = []
    lw.start(its, arena, lambda: released.append(1))
    assert lw.ring == min(slabs, len(names))
    assert all(not t.any() for t in dst.values()), "nothing lands before its layer runs"
    for i, n in enumerate(names):
        lw.wait(n)
        for j, m in enumerate(names):
            assert torch.equal(dst[m], want[m]) == (j <= i) or not want[m].any(), (i, j)
    assert released == [1] and not failed and not lw.active
    assert counters["load_layerwise_waits"] == len(names) and counters["load_layerwise_late_layers"] == 0
    assert gpu.counters["load_dma_chunks"] == len(its)


def test_the_load_sample_is_the_dma_time_not_the_forward() -> None:
    """The cost model's sample of a layer-wise load is the DMAs' own time: the forward paces the
    ring (a slab is reused only after its layer ran), so a sample timed until the last DMA would
    count the forward too, and the load policy ``auto`` then recomputed every hit (H200, 2026-12-05:
    every RAM hit of a 4k to 16k sweep, 4 to 7 times faster to load)."""
    dst, _want, arena, cb = reference("0.26-nhd")
    layout = KVLayout.from_caches(dst, B)
    names = [lb.name for lb in layout.layers]
    gpu = GpuCopier(layout, BPC, staging_bytes=4 * cb)
    lw = GpuLayerwise(gpu, torch_rows, Counter(), lambda ids: None)
    its = items(cb)
    gpu.load_pool.buf = torch.empty(2 * lw.slab_bytes(len(its)), dtype=torch.uint8)  # a paced ring
    samples: list[float] = []
    released: list[int] = []
    forward = 0.02  # each layer's compute, between the waits
    lw.start(its, arena, lambda: released.append(1), samples.append)
    for n in names:
        time.sleep(forward)
        lw.wait(n)
    assert released == [1] and len(samples) == 1
    assert 0 < samples[0] < forward, (
        f"{samples[0]:.4f} s: the forward ({forward * len(names):.2f} s) was counted"
    )
    assert gpu.counters["load_dma_us"] == int(samples[0] * 1e6)


def test_a_layer_run_without_its_wait_is_recomputed() -> None:
    dst, want, arena, cb = reference("0.26-nhd")
    layout = KVLayout.from_caches(dst, B)
    names = [lb.name for lb in layout.layers]
    gpu = GpuCopier(layout, BPC, staging_bytes=4 * cb)
    counters: Counter[str] = Counter()
    failed: list[list[int]] = []
    released: list[int] = []
    lw = GpuLayerwise(gpu, torch_rows, counters, failed.append)
    lw.start(items(cb), arena, lambda: released.append(1))
    lw.wait(names[2])  # layers 0 and 1 ran without waiting
    lw.wait(names[1])  # already copied: nothing more
    assert torch.equal(dst[names[2]], want[names[2]]) and not dst[names[3]].any()
    assert released == [] and failed == []
    lw.finish()  # the step ends before layers 3 and 4 were waited for
    assert all(torch.equal(dst[n], want[n]) for n in names)
    assert counters["load_layerwise_late_layers"] == 4 and released == [1]
    assert failed == [it.block_ids[it.skip : it.stop] for it in items(cb)]
    lw.finish()  # a second end is nothing
    assert released == [1]


def test_a_failed_dma_fails_the_step_and_releases() -> None:
    dst, _want, arena, cb = reference("0.26-nhd")
    gpu = GpuCopier(KVLayout.from_caches(dst, B), BPC, staging_bytes=4 * cb)
    failed: list[list[int]] = []
    released: list[int] = []

    def broken(*args: Any) -> None:
        raise RowCopyError("cudaMemcpy2DAsync failed with error 1")

    lw = GpuLayerwise(gpu, broken, Counter(), failed.append)
    lw.start(items(cb), arena, lambda: released.append(1))
    assert released == [1] and len(failed) == len(DST) and not lw.active
    assert all(not t.any() for t in dst.values())


def test_a_step_too_big_for_two_slabs_does_not_fit() -> None:
    layout = KVLayout.from_caches(five_layers(), B)
    cb = layout.chunk_bytes(BPC)
    gpu = GpuCopier(layout, BPC, staging_bytes=2 * cb)
    lw = GpuLayerwise(gpu, torch_rows, Counter(), lambda ids: None)
    per_chunk = lw.slab_bytes(1)
    most = gpu.load_pool.buf.numel() // (2 * per_chunk)
    assert lw.fits(most) and not lw.fits(most + 8)


def costed() -> tuple[GpuLayerwise, Counter[str], int]:
    """A layer-wise loader of five layers on CPU stand-ins (rates to inject), its counters and
    chunk bytes: for the rule that picks whole-step loads."""
    layout = KVLayout.from_caches(five_layers(), B)
    cb = layout.chunk_bytes(BPC)
    counters: Counter[str] = Counter()
    lw = GpuLayerwise(GpuCopier(layout, BPC, staging_bytes=4 * cb), torch_rows, counters, lambda ids: None)
    return lw, counters, cb


def one_run(cb: int) -> list[LoadItem]:
    """Three chunks side by side in the arena."""
    return [LoadItem(d, 0, BPC, (2 + i) * cb, cb) for i, d in enumerate(DST[:3])]


def test_a_scattered_step_loads_whole_when_queueing_costs_more_than_half_its_dma() -> None:
    """Layer by layer, a step queues ``runs x layers`` DMAs instead of ``runs``: with rates
    injected, the step goes whole exactly when ``runs x (layers - 1)`` calls at the per-call cost
    exceed half of its DMA time; one run is never scattered, however slow a call."""
    lw, counters, cb = costed()
    its = items(cb)  # 3 runs, 5 layers: 12 extra calls
    lw.dma_gbps = 10.0
    half_dma = 0.5 * len(its) * cb / 10e9
    lw.call_s = half_dma / 12 * 0.9
    assert not lw.too_costly(its) and counters["load_layerwise_scattered_steps"] == 0
    lw.call_s = half_dma / 12 * 1.1
    assert lw.too_costly(its) and counters["load_layerwise_scattered_steps"] == 1
    lw.dma_gbps = 1.0  # a slower link leaves more DMA time to hide the calls behind
    assert not lw.too_costly(its)
    lw.call_s = 1.0
    assert not lw.too_costly(one_run(cb))


def test_a_small_step_loads_whole_when_its_layers_cost_more_cpu_than_half_its_dma() -> None:
    """Each layer's wait costs CPU on the step's thread whatever the step's size: a step whose
    DMA is too short to hide ``layers x layer_s`` behind loads whole, counted as small (not as
    scattered, even in several runs, while the per-layer cost is the larger part)."""
    lw, counters, cb = costed()
    assert lw.layer_s == 0.0 and lw.call_s == 0.0, "CPU stand-ins: nothing queued, nothing to weigh"
    run = one_run(cb)
    lw.dma_gbps = 10.0
    half_dma = 0.5 * len(run) * cb / 10e9
    lw.layer_s = half_dma / 5 * 0.9
    assert not lw.too_costly(run) and counters["load_layerwise_small_steps"] == 0
    lw.layer_s = half_dma / 5 * 1.1
    assert lw.too_costly(run) and counters["load_layerwise_small_steps"] == 1
    lw.layer_s, lw.call_s = 1.0, 0.1  # 3 runs: 12 extra calls (1.2 s) against 5 layers (5 s)
    assert lw.too_costly(items(cb)) and counters["load_layerwise_small_steps"] == 2
    assert counters["load_layerwise_scattered_steps"] == 0
    lw.layer_s = half_dma / 5 * 1.1
    lw.dma_gbps = 1.0  # ten times the DMA time to hide them behind
    assert not lw.too_costly(run)


# -- the worker, against a real daemon -------------------------------------------------------
def _run_step(w: Any, meta: InferaKvdMetadata, names: list[str], waits: list[str]) -> None:
    w.load(meta)
    for n in waits:
        w.wait_layer(n)
    w.finish_layers()
    w.gpu.drain()


@pytest.mark.parametrize("staging_chunks", [64, 2])
def test_worker_loads_layer_by_layer(daemon: Any, staging_chunks: int) -> None:
    caches = per_layer_nhd(L=4, N=4)
    names = sorted(caches)
    cb = KVLayout.from_caches(caches, B).chunk_bytes(2)
    # 2 staging cells: a 6-chunk step needs 2 slabs of 1.5 chunks, which do not fit
    staging = staging_chunks * cb * 4 // 3
    env = ConnectorEnv(socket=daemon.socket, load_layerwise=True, gpu_staging_bytes=staging)
    w = gpu_worker(daemon.socket, env=env)
    w.register(caches)
    assert w.gpu_layerwise is not None and w.layerwise is w.gpu_layerwise
    hashes = [bytes([i + 1]) * 16 for i in range(6)]
    src = [[1 + 2 * i, 2 + 2 * i] for i in range(6)]
    saves = [ChunkJob(h, ids) for h, ids in zip(hashes, src, strict=True)]
    w.save(InferaKvdMetadata(saves=[RequestJob("r", saves)]))
    w.gpu.drain()
    before = {n: t.clone() for n, t in caches.items()}
    dst = [[20 + 2 * i, 21 + 2 * i] for i in range(6)]
    meta = InferaKvdMetadata(
        loads=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(hashes, dst, strict=True)])]
    )
    _run_step(w, meta, names, names)
    for n in names:
        for s, d in zip(src, dst, strict=True):
            assert torch.equal(caches[n][d], before[n][s])
    assert w.take_load_errors() == set()
    big = staging_chunks > 2
    assert w.counters["load_layerwise_steps"] == (1 if big else 0)
    assert w.counters["load_layerwise_whole_steps"] == (0 if big else 1), "too small a ring: the whole step"
    # the step's trace ended with it (finish_layers: wait_for_save); on the CPU only its CPU side
    c = w.counters
    assert c["load_lw_traced_steps"] == (1 if big else 0)
    if big:
        assert 0 < c["load_lw_cpu_first_wait_us"] <= c["load_lw_cpu_us"], c
        assert c["load_lw_gpu_us"] == c["load_lw_dma_end_us"] == 0, "no GPU events on the CPU path"
        w.finish_layers()
        assert c["load_lw_traced_steps"] == 1, "a step's trace is counted once"
    w.link.client().ping()
    with daemon.client(want_arena=False) as c:
        row = next(cl for cl in c.stats()["clients"] if cl["role"] == "vllm-worker-0")
        assert row["leases"] == 0, "every lease went back once the DMAs were done"
    # the same step again, its layers run without their waits: exact bytes, but recomputed
    for t in caches.values():
        t[20:32] = 0
    _run_step(w, meta, names, [])
    for n in names:
        for s, d in zip(src, dst, strict=True):
            assert torch.equal(caches[n][d], before[n][s])
    assert w.take_load_errors() == ({x for d in dst for x in d} if big else set())


def test_a_worker_loads_scattered_chunks_whole_and_neighbours_layer_by_layer(daemon: Any) -> None:
    """Two prompts saved in one step, their chunks interleaved in the arena: loading one of them
    is a run per chunk. At a per-call cost that outweighs the DMA the worker loads that step whole
    (counted), at a negligible one layer by layer; a prompt saved on its own is one run and goes
    layer by layer even at that cost. The bytes are right every time."""
    caches = per_layer_nhd(L=4, N=4, D=16)
    names = sorted(caches)
    cb = KVLayout.from_caches(caches, B).chunk_bytes(2)
    assert cb % 4096 == 0, "chunks that fill whole arena pages, so neighbours form one run"
    env = ConnectorEnv(socket=daemon.socket, load_layerwise=True, gpu_staging_bytes=64 * cb)
    w = gpu_worker(daemon.socket, env=env)
    w.register(caches)
    lw = w.gpu_layerwise
    assert lw is not None
    ours = [bytes([i + 1]) * 16 for i in range(4)]
    theirs = [bytes([i + 101]) * 16 for i in range(4)]
    alone = [bytes([i + 201]) * 16 for i in range(4)]
    src = [[1 + 2 * i, 2 + 2 * i] for i in range(8)]
    alone_src = [[30 + 2 * i, 31 + 2 * i] for i in range(4)]
    interleaved = [h for pair in zip(ours, theirs, strict=True) for h in pair]
    w.save(
        InferaKvdMetadata(
            saves=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(interleaved, src, strict=True)])]
        )
    )
    w.gpu.drain()
    w.save(
        InferaKvdMetadata(
            saves=[RequestJob("s", [ChunkJob(h, ids) for h, ids in zip(alone, alone_src, strict=True)])]
        )
    )
    w.gpu.drain()
    before = {n: t.clone() for n, t in caches.items()}
    dst = [[20 + 2 * i, 21 + 2 * i] for i in range(4)]
    cases = ((ours, src[0::2], 1.0, 0), (ours, src[0::2], 1e-15, 1), (alone, alone_src, 1.0, 2))
    for keys, want, call_s, layerwise in cases:
        for t in caches.values():
            t[20:28] = 0
        lw.call_s = call_s
        meta = InferaKvdMetadata(
            loads=[RequestJob("r", [ChunkJob(h, d) for h, d in zip(keys, dst, strict=True)])]
        )
        _run_step(w, meta, names, names)
        for n in names:
            for s_ids, d in zip(want, dst, strict=True):
                assert torch.equal(caches[n][d], before[n][s_ids])
        assert w.take_load_errors() == set()
        assert w.counters["load_layerwise_steps"] == layerwise, (call_s, layerwise)
    assert w.counters["load_layerwise_scattered_steps"] == 1, "only the interleaved slow-call step went whole"
    assert w.counters["load_layerwise_whole_steps"] == 1


def test_no_layerwise_without_the_flag_or_on_a_cpu_path(daemon: Any) -> None:
    w = gpu_worker(daemon.socket, env=ConnectorEnv(socket=daemon.socket))
    w.register(per_layer_nhd(L=3, N=4))
    assert w.gpu_layerwise is None and w.layerwise is None
    facts = engine_facts(model="/m/cpu", num_layers=3, head_size=8, block_size=4, vllm_version="0.26")
    cpu = worker_half(facts, 8, daemon.socket, B, env=ConnectorEnv(socket=daemon.socket, load_layerwise=True))
    cpu.register(per_layer_nhd(L=3, N=4))
    assert cpu.gpu_layerwise is None and cpu.layerwise is not None
