"""Layer-wise loads on the GPU copy path (``INFERA_KVD_LOAD_LAYERWISE=1``).

The whole-step load (:meth:`GpuCopier.load`) moves every layer of a chunk in one DMA, so the
forward pass waits for the last byte of the step before its first layer. Here the DMAs run layer
by layer instead, and each layer waits only for its own:

* the load staging buffer becomes a ring of ``K`` slabs; slab ``l % K`` holds layer ``l`` of every
  chunk of the step (``[chunk][block][page]``), filled by one 2D DMA per run of neighbouring chunks
  (:mod:`~infera.engine.vllm.worker.gpu.rows`) on the host-to-device side stream;
* ``start`` checks every chunk (as the whole-step load does), queues the first ``K`` layers and
  returns; vLLM's ``wait_for_layer_load(l)`` then queues, on the compute stream, a wait for layer
  ``l``'s DMA and one indexed copy of the slab into that layer's blocks, and then the DMA of layer
  ``l + K`` into the slab just freed. The GPU never stalls the CPU; the CPU never waits for the GPU;
* the step's leases are released by the completion thread once the last DMA has completed; the
  link's ``using`` bracket is held from the LEASE until the last DMA is queued, so a reconnect
  (which drains the copier before it unmaps the arena) never meets a DMA still to be queued.

A layer vLLM ran without waiting for may have read its blocks before the copy: at the end of the
step (``wait_for_save``, or the next step's start) every layer not yet copied is copied and the
step's blocks are reported as load errors, so vLLM recomputes them, as on the CPU path
(:mod:`~infera.engine.vllm.worker.layerwise`). A step whose slabs do not fit twice in the staging
buffer, a hybrid model, or a GPU-direct read loads the whole step as before (counted).

**When layer by layer pays.** Each layer costs the step's thread CPU time in vLLM's
``wait_for_layer_load`` (queueing a wait, the slab's indexed copy, the next DMA and its events):
about 0.15 ms per layer on the H100, 5 ms for a 32-layer model, which the forward of an eager
engine pays on top of its own launches. It pays back only by hiding DMA time: a 16k-token hit's
40 ms, yes; a 512-token hit's 1.3 ms, no (layer by layer it took 34 ms against 20 ms recomputed
and 23 ms loaded whole, H100 run K). A step also queues one DMA per run of neighbouring chunks
*per layer*, where a whole-step load queues one per run. In a fresh arena a prompt's chunks sit
next to each other (one run); in a long-lived one, best-fit reuse of evicted regions scatters
them, up to one run per chunk: 512 scattered chunks on 32 layers would queue 16,384 DMAs. So a
step goes layer by layer only while its extra CPU, ``layers x layer_s + runs x (layers - 1) x
call_s`` at the measured per-layer and per-call costs, stays under half of what its DMAs take at
the measured rate (warm-up defaults until a layer-wise step measures them); otherwise it loads
the whole step, counted in ``load_layerwise_small_steps`` (the per-layer cost outweighs) or
``load_layerwise_scattered_steps`` (the per-call cost does), each logged once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from infera.engine.vllm.worker.gpu.copier import GpuCopier
from infera.engine.vllm.worker.gpu.rows import RowCopy, row_copier
from infera.engine.vllm.worker.gpu.staging import LoadItem
from infera.engine.vllm.worker.gpu.steptrace import StepTrace

log = logging.getLogger("infera.engine.vllm")

ALIGN = 256  # slab starts: aligned for every index dtype and for the DMA engines
# warm-up defaults of the rates the whole-step rule (too_costly) uses, until a step measures them
CALL_S = 10e-6  # CPU seconds to check and queue one row copy (ctypes call + driver)
DMA_GBPS = 25.0  # host-to-device rate of a step's DMAs (pinned PCIe 5: about 55)
LAYER_S = 150e-6  # CPU seconds of one layer's wait_for_layer_load, row copies aside (H100: ~0.15 ms)
EWMA = 0.3  # weight of a new measurement
SCATTER_SHARE = 0.5  # extra CPU allowed, as a share of the step's DMA time


def runs_of(items: list[LoadItem], chunk_bytes: int) -> list[tuple[int, int, int]]:
    """``(first item, count, arena offset)`` for each run of items that sit next to each other in
    the arena in the same order."""
    runs: list[tuple[int, int, int]] = []
    for i, it in enumerate(items):
        if runs:
            first, n, off = runs[-1]
            if it.offset == off + n * chunk_bytes:
                runs[-1] = (first, n + 1, off)
                continue
        runs.append((i, 1, it.offset))
    return runs


class GpuLayerwise:
    """One worker's layer-wise loads (single KV cache group, GPU copy path)."""

    def __init__(
        self, gpu: GpuCopier, rows: RowCopy, counters: Any, on_failed: Callable[[list[int]], None]
    ) -> None:
        self.gpu = gpu
        self.rows = rows
        self.counters = counters
        self.on_failed = on_failed
        self.layers = gpu.layout.layers
        self.index = {lb.name: i for i, lb in enumerate(self.layers)}
        self._hold = contextlib.ExitStack()
        self._warned = False
        self._warned_costly: set[str] = set()
        # measured: CPU time per queued row copy. Synchronous stand-ins (HostOps: CPU tests and dry
        # runs) copy in the call itself, so there is no queueing to weigh against the DMA
        self.call_s = 0.0 if gpu.ops.synchronous else CALL_S
        self.layer_s = 0.0 if gpu.ops.synchronous else LAYER_S  # measured: CPU per layer's wait
        self.dma_gbps = DMA_GBPS  # measured: bytes over the DMAs' own time, per step
        self.trace = StepTrace(gpu.ops, gpu.completer, counters)  # where each step's time went
        self._reset()

    def _reset(self) -> None:
        self.items: list[LoadItem] = []
        self.arena: torch.Tensor | None = None
        self.next_dma = 0  # the next layer to queue a DMA for
        self.next_copy = 0  # the next layer to copy into its blocks
        self.dma_done: list[Any] = []
        self.dma_spans: list[tuple[Any, Any]] = []  # each layer's DMA, begin and end events
        self.dma_wall = 0.0  # CPU time queueing the DMAs (HostOps: the copies themselves)
        self.dma_calls = 0
        self.wait_wall = 0.0  # CPU time in wait(), its row copies aside
        self.waits = 0
        self.freed: list[Any] = []
        self.late = 0
        self._on_done: Callable[[], None] | None = None
        self._on_dma: Callable[[float], None] | None = None
        self._whole: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._parts: list[tuple[int, torch.Tensor]] = []

    @classmethod
    def create(
        cls, gpu: GpuCopier | None, hybrid: bool, counters: Any, on_failed: Callable[[list[int]], None]
    ) -> tuple[GpuLayerwise | None, str | None]:
        """The worker's layer-wise loads, or None and the reason there are none."""
        if hybrid or gpu is None:
            return None, "the GPU copy path of single-group engines"
        rows, how = row_copier(gpu.device)
        if rows is None:
            return None, f"no strided copies on this GPU ({how})"
        log.info("infera-kvd: layer-wise loads on the GPU, one %s per run of chunks per layer", how)
        return cls(gpu, rows, counters, on_failed), None

    @property
    def active(self) -> bool:
        return bool(self.items)

    def slab_bytes(self, n: int) -> int:
        biggest = max(lb.page_bytes for lb in self.layers) * self.gpu.bpc * n
        return -(-biggest // ALIGN) * ALIGN

    def fits(self, n: int) -> bool:
        """Whether ``n`` chunks fit the ring (two slabs at least) and there is a layer to overlap."""
        return len(self.layers) > 1 and n > 0 and self.gpu.load_pool.buf.numel() // self.slab_bytes(n) >= 2

    def too_costly(self, items: list[LoadItem]) -> bool:
        """Whether loading ``items`` layer by layer would cost more CPU than half of what their
        DMAs take (then the whole step loads at once, counted as ``small`` or ``scattered``)."""
        runs = len(runs_of(items, self.gpu.chunk_bytes))
        layers = len(self.layers)
        # one run queues one call per layer: that is part of the per-layer cost
        calls_s = runs * (layers - 1) * self.call_s if runs > 1 else 0.0
        layers_s = layers * self.layer_s
        dma_s = sum(it.length for it in items) / (self.dma_gbps * 1e9)
        if calls_s + layers_s <= SCATTER_SHARE * dma_s:
            return False
        why = "scattered" if runs > 1 and calls_s > layers_s else "small"
        self.counters[f"load_layerwise_{why}_steps"] += 1
        if why not in self._warned_costly:
            self._warned_costly.add(why)
            place = f" in {runs} separate places of the arena" if why == "scattered" else ""
            log.info(
                "infera-kvd: a %d-chunk load%s would cost about %.1f ms of CPU layer by layer "
                "(%d layers, %d DMA calls) against %.1f ms of DMA to hide, so it loads the whole "
                "step at once (counted in load_layerwise_%s_steps)",
                len(items),
                place,
                (calls_s + layers_s) * 1e3,
                layers,
                runs * layers,
                dma_s * 1e3,
                why,
            )
        return True

    def hold(self, bracket: Any) -> None:
        """Keep the link's ``using`` bracket (entered by the caller) until :meth:`finish`."""
        self._hold.enter_context(bracket)

    # -- the step ----------------------------------------------------------------------------
    def start(
        self,
        items: list[LoadItem],
        arena: torch.Tensor,
        on_done: Callable[[], None],
        on_dma: Callable[[float], None] | None = None,
    ) -> None:
        """Queue the first layers of ``items`` (already checked); ``on_done`` runs once the arena
        is no longer read. ``on_dma`` gets the seconds the DMAs themselves took, summed over the
        layers (what a load before the forward would cost; the wall time from the first DMA to the
        last one follows the forward, which paces the ring and the waits), when every layer moved."""
        gpu, ops = self.gpu, self.gpu.ops
        n = len(items)
        self._reset()
        self.items, self.arena, self._on_done, self._on_dma = items, arena, on_done, on_dma
        self.slab = self.slab_bytes(n)
        self.ring = min(len(self.layers), gpu.load_pool.buf.numel() // self.slab)
        self.runs = runs_of(items, gpu.chunk_bytes)
        # the buffer may still be read by an earlier step's copies
        for ev in gpu.load_pool.free:
            ops.wait(gpu.h2d, ev)
        whole = [i for i, it in enumerate(items) if it.skip == 0 and it.stop == gpu.bpc]
        if whole:
            ids = gpu._index([items[i].block_ids for i in whole])
            self._whole = (ids, None if len(whole) == n else gpu._index(whole))
        self._parts = [
            (i, gpu._index(it.block_ids[it.skip : it.stop]))
            for i, it in enumerate(items)
            if not (it.skip == 0 and it.stop == gpu.bpc)
        ]
        self.freed = [None] * self.ring
        self.counters["load_layerwise_steps"] += 1
        self.trace.begin()
        try:
            while self.next_dma < self.ring:
                self._dma(self.next_dma)
        except Exception:  # never into vLLM: the step's blocks are recomputed
            log.exception("infera-kvd: a layer-wise load could not start; recomputing those blocks")
            self._fail_all()
            self._complete()

    def _slot(self, layer: int) -> torch.Tensor:
        lo = (layer % self.ring) * self.slab
        return self.gpu.load_pool.buf[lo : lo + self.slab]

    def _dma(self, layer: int) -> None:
        gpu, ops = self.gpu, self.gpu.ops
        width = gpu.bpc * self.layers[layer].page_bytes
        slot = self._slot(layer)
        ops.wait(gpu.h2d, self.freed[layer % self.ring])
        with ops.use(gpu.h2d):
            begin = ops.record(gpu.h2d, timing=True)
            t = time.perf_counter()
            for first, count, off in self.runs:
                self.rows(
                    slot,
                    first * width,
                    width,
                    self.arena,
                    off + gpu.layer_off[layer],
                    gpu.chunk_bytes,
                    width,
                    count,
                    gpu.h2d,
                )
            self.dma_wall += time.perf_counter() - t
            end = ops.record(gpu.h2d, timing=True)
            self.dma_calls += len(self.runs)
        self.dma_done.append(end)
        self.dma_spans.append((begin, end))
        self.trace.dma(begin, end)
        self.next_dma += 1

    def _copy(self, layer: int) -> None:
        """Layer ``layer``'s slab into its blocks, on the compute stream behind its DMA; then the
        DMA that reuses the slab."""
        gpu, ops = self.gpu, self.gpu.ops
        compute = ops.current_stream()
        ops.wait(compute, self.dma_done[layer])
        dst = gpu.wide_layers[layer]
        n = len(self.items)
        src = self._slot(layer)[: n * gpu.bpc * self.layers[layer].page_bytes]
        src = src.view(dst.dtype).view(n, gpu.bpc, dst.size(-1))
        with ops.use(compute):
            if self._whole is not None:
                ids, pick = self._whole
                dst[ids] = src if pick is None else src[pick]
            for i, ids in self._parts:
                it = self.items[i]
                dst[ids] = src[i, it.skip : it.stop]
        self.freed[layer % self.ring] = ops.record(compute)
        self.next_copy += 1
        if self.next_dma < len(self.layers):
            self._dma(self.next_dma)

    def wait(self, layer_name: str) -> None:
        """vLLM is about to run ``layer_name``: its KV (and that of any layer skipped before it)
        is copied in first, on the GPU."""
        layer = self.index.get(layer_name)
        if not self.items or layer is None or layer < self.next_copy:
            return
        self.trace.waited()
        t, dma_before = time.perf_counter(), self.dma_wall
        while self.next_copy < layer:  # ran without waiting: its blocks are recomputed
            self.late += 1
            self._copy(self.next_copy)
        self._copy(layer)
        self.counters["load_layerwise_waits"] += 1
        self.wait_wall += time.perf_counter() - t - (self.dma_wall - dma_before)
        self.waits += 1
        if self.next_copy == len(self.layers):
            self.finish()

    def finish(self) -> None:
        """Copy the layers not waited for, report their blocks, release when the DMAs are done."""
        if not self.items:
            return
        gpu = self.gpu
        try:
            left = len(self.layers) - self.next_copy
            while self.next_copy < len(self.layers):
                self._copy(self.next_copy)
            self.late += left
            if self.late:
                self._late()
        except Exception:  # never into vLLM: those blocks become load errors
            log.exception("infera-kvd: a layer-wise load failed; recomputing those blocks")
            self._fail_all()
            gpu.ops.sync_all()  # nothing may still read the arena or the ring when it is reused
        finally:
            last = self.freed[(len(self.layers) - 1) % self.ring] if self.freed else None
            gpu.load_pool.free = [last, last]
            self._complete()

    def _late(self) -> None:
        self.counters["load_layerwise_late_layers"] += self.late
        if not self._warned:
            self._warned = True
            log.warning(
                "infera-kvd: vLLM did not call wait_for_layer_load for %d of %d layers before they "
                "ran; those loads are recomputed (INFERA_KVD_LOAD_LAYERWISE=0 loads every layer "
                "before the forward)",
                self.late,
                len(self.layers),
            )
        self._fail_all()

    def _fail_all(self) -> None:
        for it in self.items:
            self.on_failed(it.block_ids[it.skip : it.stop])

    def _complete(self) -> None:
        gpu, ops = self.gpu, self.gpu.ops
        n = len(self.items)
        total = sum(it.length for it in self.items)
        on_done, on_dma, hold = self._on_done, self._on_dma, self._hold
        self._hold = contextlib.ExitStack()
        complete = len(self.dma_done) == len(self.layers)
        spans, wall, calls = self.dma_spans, self.dma_wall, self.dma_calls
        if calls and not ops.synchronous:  # HostOps copies the bytes in the call: no queueing cost
            self.call_s += EWMA * (wall / calls - self.call_s)
        if self.waits and not ops.synchronous:
            self.layer_s += EWMA * (self.wait_wall / self.waits - self.layer_s)
        end = self.dma_done[-1] if complete else None
        self._reset()
        gpu._count("load_dma_chunks", n)
        gpu._count("load_dma_bytes", total)

        # every DMA is queued: a reconnect may now go ahead, it drains the copier before it
        # unmaps the arena (the bracket is a lock of this thread: closed here, not on completion)
        hold.close()

        def done() -> None:
            if complete:
                dma_s = wall if ops.synchronous else sum(ops.elapsed_ms(b, e) for b, e in spans) / 1000
                gpu._count("load_dma_us", int(dma_s * 1e6))
                if dma_s > 0 and not ops.synchronous:
                    self.dma_gbps += EWMA * (total / dma_s / 1e9 - self.dma_gbps)
                if on_dma is not None:
                    on_dma(dma_s)
            if on_done is not None:
                on_done()

        if end is None:
            ops.sync_all()
            done()
            return
        gpu.completer.after(end, done)
