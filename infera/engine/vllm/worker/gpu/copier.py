"""KV on a GPU: copies between vLLM's blocks and the daemon arena at PCIe speed.

Why this module exists: a host<->device copy from ordinary (pageable) memory runs at a tenth of
the link speed, and vLLM's blocks are too small (one layer's page of one block is 8-72 KiB) for a
DMA each. So:

* the arena mapping is **registered** once per connection (``cudaHostRegister``, about 45 ms per
  GiB), which makes it pinned memory as far as the copy engines are concerned; a failed
  registration is a reported fallback, never silent;
* a chunk moves between the arena and a **staging** buffer on the GPU with **one DMA**, and
  between staging and the blocks with **one indexed copy per layer per group of chunks** (one per
  group when every layer is a view of one buffer): no per-block launches;
* the DMAs run on **side streams**; the forward pass only waits (on the GPU, never on the CPU)
  for what it reads: the scatter of a load is queued on the compute stream behind the load's DMA
  event, and a save's gather runs behind an event recorded on the compute stream when
  ``wait_for_save`` is called;
* completion is handled by a small thread that waits on the DMA events: leases are released and
  reservations sealed only once the bytes have really moved.

The staging pools are bounded (``INFERA_KVD_GPU_STAGING_MB``, split between loads and saves) and
used as two halves, so the DMA of one group overlaps the indexed copies of the next. The same
code runs on the CPU with synchronous stand-ins for streams and events (:class:`HostOps`): the
tests exercise the grouping, indexing and byte layout on real tensors without a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from infera.engine.vllm.worker.gpu.kernel import make_page_kernel
from infera.engine.vllm.worker.gpu.runtime import (
    ArenaPin,
    Completer,
    CudaOps,
    HostOps,
    Registered,
    cuda_host_register,
    cuda_host_unregister,
    ops_for,
    timed,
)
from infera.engine.vllm.worker.gpu.staging import (
    LoadItem,
    SaveItem,
    StagingPool,
    dma_runs,
    groups_of,
    index_dtype,
)
from infera.engine.vllm.worker.layout import KVLayout, LayoutError

log = logging.getLogger("infera.engine.vllm")

DEFAULT_STAGING_BYTES = 768 << 20
LOAD_SHARE = 3 / 4  # loads are on the TTFT path: bigger groups, fewer indexed copies per step


class GpuCopier:
    """Moves whole chunks between the arena (a host tensor) and the blocks of ``layout``.

    ``blocks_per_chunk`` fixes the chunk size the pools are cut for; every chunk the scheduler
    plans has exactly that many blocks."""

    def __init__(
        self,
        layout: KVLayout,
        blocks_per_chunk: int,
        *,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        ops: HostOps | None = None,
        kernel_mode: str = "auto",
    ) -> None:
        self.layout = layout
        self.device = layout.device
        self.ops = ops or ops_for(self.device)
        self.bpc = blocks_per_chunk
        self.chunk_bytes = layout.chunk_bytes(blocks_per_chunk)
        self.load_pool = self._pool(int(staging_bytes * LOAD_SHARE))
        self.save_pool = self._pool(staging_bytes - int(staging_bytes * LOAD_SHARE))
        self.staging_bytes = (self.load_pool.cells + self.save_pool.cells) * self.chunk_bytes
        self._views: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.h2d = self.ops.new_stream()
        self.d2h = self.ops.new_stream()
        self.gather_stream = self.ops.new_stream()
        self.completer = Completer(self.ops)
        self._pending_gather: Any = None
        self.n_layers = len(layout.layers)
        cb = self.chunk_bytes
        self.layer_off: list[int] = []
        self.wide_layers: list[torch.Tensor] = []
        pos = 0
        for lb in layout.layers:
            dtype = index_dtype(lb.page_bytes, lb.block_stride, lb.offset, pos, cb)
            self.layer_off.append(pos)
            self.wide_layers.append(lb.view.view(dtype))
            pos += self.bpc * lb.page_bytes
        self.stacked: torch.Tensor | None = None
        if layout.stacked is not None:
            first = layout.layers[0]
            st = layout.stacked
            dtype = index_dtype(first.page_bytes, first.block_stride, first.offset, st.stride(0), cb)
            self.stacked = st.view(dtype)
        self.dtype = self.wide_layers[0].dtype
        self.counters: dict[str, int] = {}
        self.kernel, self.kernel_why = make_page_kernel(layout, self.bpc, cb, kernel_mode)
        self._slots: torch.Tensor | None = None

    @property
    def copy_kernel(self) -> str:
        """``triton`` (one launch per group for every layer) or ``torch`` (per-layer copies)."""
        return "triton" if self.kernel is not None else "torch"

    def describe(self) -> str:
        if self.kernel is not None:
            how = f"one Triton launch per group over {self.n_layers} layers"
        else:
            how = f"indexed copies as {self.dtype} ({self.kernel_why})"
        return (
            f"GPU staging {self.staging_bytes >> 20} MiB ({self.load_pool.half} chunks of "
            f"{self.chunk_bytes} bytes per DMA group), {how}".replace("torch.", "")
        )

    def _slot_range(self, n: int) -> torch.Tensor:
        """Staging slots ``0..n-1`` on the device, made once."""
        if self._slots is None or self._slots.numel() < n:
            size = max(n, self.load_pool.half * self.bpc, self.save_pool.half * self.bpc)
            self._slots = torch.arange(size, dtype=torch.long, device=self.device)
        return self._slots[:n]

    def _index(self, values: Any) -> torch.Tensor:
        """Block ids as a device tensor without stalling the CPU: ``torch.tensor(..., device=)``
        copies from pageable memory and waits for the whole current stream, which here is
        queued behind DMAs, so the pipeline would run one group at a time (measured on the
        H200: 0.5 of the link instead of 0.9). Pinned memory and a non-blocking copy instead."""
        t = torch.tensor(values, dtype=torch.long)
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _count(self, name: str, n: int) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _pool(self, nbytes: int) -> StagingPool:
        cells = max(2, nbytes // self.chunk_bytes)
        return StagingPool(cells - cells % 2, self.chunk_bytes, self.device)

    def _layer_srcs(self, region: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Every layer's view of ``n`` staged chunks, built once per (buffer, n): building 4 views
        per layer per group was a third of the CPU time of a step's copies."""
        key = (region.data_ptr(), n)
        views = self._views.get(key)
        if views is None:
            views = [self._layer_src(region, n, i) for i in range(self.n_layers)]
            if len(self._views) > 64:
                self._views.clear()
            self._views[key] = views
        return views

    def _layer_src(self, region: torch.Tensor, n: int, layer: int) -> torch.Tensor:
        """Layer ``layer`` of ``n`` staged chunks as ``[chunk, block, page elements]``."""
        w = self.wide_layers[layer]
        off = self.layer_off[layer]
        size = self.bpc * self.layout.layers[layer].page_bytes
        v = region[: n * self.chunk_bytes].view(n, self.chunk_bytes)[:, off : off + size]
        return v.view(w.dtype).view(n, self.bpc, w.size(-1))

    def _stacked_src(self, region: torch.Tensor, n: int) -> torch.Tensor:
        """``n`` staged chunks as ``[chunk, layer, block, page elements]`` (uniform layers only)."""
        assert self.stacked is not None
        dt = self.stacked.dtype
        return region[: n * self.chunk_bytes].view(dt).view(n, self.n_layers, self.bpc, self.stacked.size(-1))

    # -- validation ---------------------------------------------------------------------------
    def check(self, block_ids: list[int], length: int) -> None:
        if len(block_ids) != self.bpc:
            raise LayoutError(f"a chunk of {len(block_ids)} blocks, this engine's chunks have {self.bpc}")
        if length != self.chunk_bytes:
            raise LayoutError(f"payload of {length} bytes, expected {self.chunk_bytes}")
        lo, hi = min(block_ids), max(block_ids)
        if lo < 0 or hi >= self.layout.num_blocks:
            raise LayoutError(f"block id {lo if lo < 0 else hi} outside 0..{self.layout.num_blocks - 1}")

    # -- ordering with the forward pass -------------------------------------------------------
    def before_forward(self) -> None:
        """Called at the start of every step: the forward may overwrite blocks a save is still
        gathering, so the compute stream waits for the last gather (on the GPU, not here)."""
        if self._pending_gather is not None:
            self.ops.wait(self.ops.current_stream(), self._pending_gather)
            self._pending_gather = None

    # -- loads --------------------------------------------------------------------------------
    def load(self, items: list[LoadItem], arena: torch.Tensor, on_done: Callable[[], None]) -> None:
        """Queue the DMAs and scatters of ``items``; ``on_done`` runs once the arena is no longer
        read (the leases may go). The compute stream is ordered after the scatters."""
        if not items:
            on_done()
            return
        ops, pool = self.ops, self.load_pool
        compute = ops.current_stream()
        last = None
        first = None
        for group in groups_of(items, pool.half):
            h, region = pool.next_half()
            ops.wait(self.h2d, pool.free[h])
            with ops.use(self.h2d):
                if first is None:
                    first = ops.record(self.h2d, timing=True)
                for lo, off, length in dma_runs(group, self.chunk_bytes):
                    region[lo : lo + length].copy_(arena[off : off + length], non_blocking=True)
                last = ops.record(self.h2d, timing=True)
            ops.wait(compute, last)
            with ops.use(compute):
                self._scatter(group, region)
            pool.free[h] = ops.record(compute)
        self._count("load_dma_chunks", len(items))
        self._count("load_dma_bytes", sum(it.length for it in items))
        start, end = first, last

        def done() -> None:
            self._count("load_dma_us", int(ops.elapsed_ms(start, end) * 1000))
            on_done()

        self.completer.after(last, done)

    def load_staged(
        self, items: list[LoadItem], fill: Callable[[int, LoadItem, torch.Tensor], bool]
    ) -> list[bool]:
        """Load chunks that something else writes into staging (GPU-direct file reads): ``fill``
        writes chunk ``i`` into the given device slice and says whether it is good. Synchronous
        towards the host (file reads are), ordered before the forward pass on the GPU."""
        ops, pool = self.ops, self.load_pool
        compute = ops.current_stream()
        ok: list[bool] = []
        for group in groups_of(items, pool.half):
            h, region = pool.next_half()
            ops.sync(pool.free[h])  # the reader writes outside any stream: the half must be idle
            keep = []
            for i, it in enumerate(group):
                lo = i * self.chunk_bytes
                keep.append(fill(len(ok), it, region[lo : lo + it.length]))
                ok.append(keep[-1])
            with ops.use(compute):
                self._scatter(group, region, keep=keep)
            pool.free[h] = ops.record(compute)
        return ok

    def _scatter(
        self, group: Sequence[LoadItem], region: torch.Tensor, keep: list[bool] | None = None
    ) -> None:
        n = len(group)
        use = [keep is None or keep[i] for i in range(n)]
        if self.kernel is not None:
            blocks: list[int] = []
            slots: list[int] = []
            for i, it in enumerate(group):
                if use[i]:
                    blocks += it.block_ids[it.skip : it.stop]
                    slots += range(i * self.bpc + it.skip, i * self.bpc + it.stop)
            if blocks:
                # an even row length keeps the slots row 16-byte aligned, as in the warm-up
                # launch: Triton compiles a variant per pointer alignment, and a new variant
                # compiled in the middle of a request would stall it
                pad = [0] * (len(blocks) % 2)
                table = self._index([blocks + pad, slots + pad])
                self.kernel.scatter(table[0, : len(blocks)], table[1, : len(blocks)], region)
            return
        whole = [i for i, it in enumerate(group) if use[i] and it.skip == 0 and it.stop == self.bpc]
        parts = [i for i, it in enumerate(group) if use[i] and (it.skip or it.stop != self.bpc)]
        if whole:
            ids = self._index([group[i].block_ids for i in whole])
            pick = None if len(whole) == n else self._index(whole)
            if self.stacked is not None:
                rows = self._stacked_src(region, n)
                rows = rows if pick is None else rows[pick]
                self.stacked[:, ids] = rows.transpose(0, 1)
            else:
                for dst, src in zip(self.wide_layers, self._layer_srcs(region, n), strict=True):
                    dst[ids] = src if pick is None else src[pick]
        for i in parts:
            it = group[i]
            ids = self._index(it.block_ids[it.skip : it.stop])
            if self.stacked is not None:
                self.stacked[:, ids] = self._stacked_src(region, n)[i, :, it.skip : it.stop]
            else:
                for layer, dst in enumerate(self.wide_layers):
                    dst[ids] = self._layer_src(region, n, layer)[i, it.skip : it.stop]

    # -- saves --------------------------------------------------------------------------------
    def save(
        self,
        items: list[SaveItem],
        arena: torch.Tensor,
        on_group_done: Callable[[list[int]], None],
        after_gather: Callable[[Sequence[SaveItem], torch.Tensor, Any], None] | None = None,
    ) -> None:
        """Queue gathers (behind the forward pass) and DMAs into the reserved regions;
        ``on_group_done(tokens)`` runs once a group's bytes are in the arena (seal them).
        ``after_gather(group, region, event)`` sees each group's staged payload (GPU-direct
        writes take their copy there)."""
        if not items:
            return
        ops, pool = self.ops, self.save_pool
        ops.wait(self.gather_stream, ops.record(ops.current_stream()))
        gathered = None
        for group in groups_of(items, pool.half):
            h, region = pool.next_half()
            ops.wait(self.gather_stream, pool.free[h])
            with ops.use(self.gather_stream):
                self._gather(group, region)
                gathered = ops.record(self.gather_stream)
            if after_gather is not None:
                after_gather(group, region, gathered)
            ops.wait(self.d2h, gathered)
            with ops.use(self.d2h):
                start = ops.record(self.d2h, timing=True)
                for lo, off, length in dma_runs(group, self.chunk_bytes):
                    arena[off : off + length].copy_(region[lo : lo + length], non_blocking=True)
                end = ops.record(self.d2h, timing=True)
            pool.free[h] = end
            tokens = [it.token for it in group]

            def done(tokens: list[int] = tokens, start: Any = start, end: Any = end) -> None:
                self._count("save_dma_us", int(ops.elapsed_ms(start, end) * 1000))
                on_group_done(tokens)

            self.completer.after(end, done)
        self._pending_gather = gathered
        self._count("save_dma_chunks", len(items))
        self._count("save_dma_bytes", sum(it.length for it in items))

    def _gather(self, group: Sequence[SaveItem], region: torch.Tensor) -> None:
        n = len(group)
        ids = self._index([it.block_ids for it in group]).view(-1)
        if self.kernel is not None:
            self.kernel.gather(ids, self._slot_range(ids.numel()), region)
            return
        if self.stacked is not None:
            picked = self.stacked.index_select(1, ids).view(self.n_layers, n, self.bpc, -1)
            self._stacked_src(region, n).copy_(picked.transpose(0, 1))
            return
        for src, dst in zip(self.wide_layers, self._layer_srcs(region, n), strict=True):
            dst.copy_(src.index_select(0, ids).view(n, self.bpc, -1))

    # -- lifecycle ----------------------------------------------------------------------------
    def drain(self) -> None:
        """Wait for every queued copy and callback (before the arena mapping goes away)."""
        self.ops.sync_all()
        self.completer.drain()

    def close(self) -> None:
        self.drain()
        self.completer.close()


__all__ = [
    "ArenaPin",
    "Completer",
    "CudaOps",
    "GpuCopier",
    "HostOps",
    "LoadItem",
    "Registered",
    "SaveItem",
    "cuda_host_register",
    "cuda_host_unregister",
    "ops_for",
    "timed",
]
