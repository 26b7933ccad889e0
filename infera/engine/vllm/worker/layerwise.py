"""Layer-wise loads (``INFERA_KVD_LOAD_LAYERWISE=1``): each layer's KV is copied in just before
that layer runs, in vLLM's ``wait_for_layer_load``, instead of all layers before the forward.

``start_load_kv`` still does the LEASE and every check (sizes, block ids) for the whole step, so
a copy deferred to a layer cannot meet a bad chunk; it only queues the copies. ``wait_for_layer_load``
then copies that layer's pages of every chunk of the step; ``wait_for_save`` (and the next
``start_load_kv``) copy whatever layers vLLM did not ask for and release the leases. A layer
vLLM did not wait for may have read its KV before the copy, so its blocks are then reported as
load errors: vLLM recomputes them, never uses stale KV. The link's
``using`` bracket is held from the LEASE to the release, so a reconnect never unmaps the arena
under a deferred copy.

This runs on the CPU copy path (single-group engines): there the copy of layer ``l`` replaces the
time layer ``l`` would have waited for the whole load. The GPU copier loads all layers before the
forward (one DMA per chunk, see docs/gpu.md); which of the two is faster on a GPU is for a
measurement to say, so the flag does not change it yet (the worker says so once).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from infera.engine.vllm.worker.layout import KVLayout

log = logging.getLogger("infera.engine.vllm")


def scatter_layer(
    layout: KVLayout, i: int, block_ids: list[int], src: torch.Tensor, skip: int, stop: int | None
) -> None:
    """Layer ``i``'s pages of a chunk payload (``[layer][block][page]``) into its blocks."""
    nb = len(block_ids)
    end = nb if stop is None else stop
    pos = sum(nb * lb.page_bytes for lb in layout.layers[:i])
    lb = layout.layers[i]
    payload = src[pos : pos + nb * lb.page_bytes].view(nb, lb.page_bytes)
    if payload.device != lb.view.device:
        payload = payload.to(lb.view.device)
    first = run_start = -1
    for k in range(skip, end + 1):  # one copy per run of consecutive block ids
        b = block_ids[k] if k < end else -2
        if first >= 0 and b == first + (k - run_start):
            continue
        if first >= 0:
            lb.view[first : first + (k - run_start)].copy_(payload[run_start:k])
        first, run_start = b, k


class LayerwiseLoads:
    """One step's deferred copies of one worker (single KV cache group)."""

    def __init__(self, layout: KVLayout, counters: Any, on_failed: Callable[[list[int]], None]) -> None:
        self.layout = layout
        self.index = {lb.name: i for i, lb in enumerate(layout.layers)}
        self.counters = counters
        self.on_failed = on_failed  # block ids whose copy failed: load errors (vLLM recomputes)
        self.pending: list[tuple[list[int], torch.Tensor, int, int | None]] = []
        self.done: set[int] = set()
        self._release: Callable[[], None] | None = None
        self._hold = contextlib.ExitStack()
        self._warned = False

    @property
    def active(self) -> bool:
        return bool(self.pending)

    def hold(self, bracket: Any) -> None:
        """Keep the link's ``using`` bracket (already entered by the caller) until :meth:`finish`."""
        self._hold.enter_context(bracket)

    def add(self, block_ids: list[int], src: torch.Tensor, skip: int, stop: int | None) -> None:
        self.layout.check_chunk(block_ids, src, skip, stop)
        self.pending.append((block_ids, src, skip, stop))

    def started(self, release: Callable[[], None]) -> None:
        """The step's chunks are queued; ``release`` gives their leases back once all are copied."""
        self._release = release
        self.done = set()
        if not self.pending:
            self.finish()

    def wait(self, layer_name: str) -> None:
        """vLLM is about to run ``layer_name``: copy its pages of every chunk of the step."""
        i = self.index.get(layer_name)
        if not self.pending or i is None or i in self.done:
            return
        self._copy(i)
        self.counters["load_layerwise_waits"] += 1
        if len(self.done) == len(self.layout.layers):
            self.finish()

    def _copy(self, i: int) -> None:
        for block_ids, src, skip, stop in self.pending:
            scatter_layer(self.layout, i, block_ids, src, skip, stop)
        self.done.add(i)

    def finish(self) -> None:
        """Copy the layers vLLM did not ask for, release the leases, end the bracket."""
        try:
            left = [i for i in range(len(self.layout.layers)) if i not in self.done]
            if self.pending and left:
                # vLLM ran these layers without waiting for them (or has not run them): their
                # KV may have been read stale, so the blocks are load errors (vLLM recomputes)
                self.counters["load_layerwise_late_layers"] += len(left)
                for i in left:
                    self._copy(i)
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "infera-kvd: vLLM did not call wait_for_layer_load for %d of %d layers before "
                        "the step ended; those loads are recomputed (INFERA_KVD_LOAD_LAYERWISE=0 "
                        "loads every layer before the forward)",
                        len(left),
                        len(self.layout.layers),
                    )
                for block_ids, _src, skip, stop in self.pending:
                    self.on_failed(block_ids[skip:stop])
        except Exception:  # never into vLLM: those blocks become load errors
            log.exception("infera-kvd: a layer-wise load failed; recomputing those blocks")
            for block_ids, _src, skip, stop in self.pending:
                self.on_failed(block_ids[skip:stop])
        finally:
            self.pending = []
            self.done = set()
            release, self._release = self._release, None
            try:
                if release is not None:
                    release()
            finally:
                self._hold.close()
