"""One GPU launch per group of chunks for layouts whose layers are separate tensors.

In vLLM 0.26 every layer's KV is its own allocation, so the torch path of
:class:`~infera.engine.vllm.worker.gpu.copier.GpuCopier` issues one indexed copy per layer for each group of
chunks (two for a save: ``index_select`` then a strided ``copy_``). With 61 to 80 layers that is
CPU-bound: measured on the H200, a 3.8 MiB chunk of a 70B model's TP4 share cost 151 us of CPU to
save against 70 us of DMA, and saves ran at 0.46 of the link.

This module moves the pages of every layer in one Triton launch. A small device table holds each
layer's base address, block stride, page size and place in the chunk payload; program
``(k, layer)`` copies page ``layer`` of block ``blocks[k]`` to or from staging slot ``slots[k]``
(chunk ``slot // bpc``, block ``slot % bpc``). The payload layout is exactly the torch path's
(``[layer][block][page]`` per chunk), so either side can read what the other wrote.

Triton is there wherever vLLM runs on a GPU; where it is missing, or on the CPU, or with
``INFERA_KVD_COPY_KERNEL=torch``, the torch path is used and :func:`make_page_kernel` says why.
Every address the kernel touches was validated by :mod:`~infera.engine.vllm.worker.layout` (page inside
its layer's storage) and block ids are range-checked before a launch, as on the torch path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from infera.engine.vllm.worker.layout import KVLayout

log = logging.getLogger("infera.engine.vllm")

KERNEL_MODES = ("auto", "triton", "torch")
_WIDE = (torch.int64, torch.int32, torch.int16, torch.uint8)

_kernel: Any = None


def _build() -> Any:
    """The Triton kernel, imported on first use (importing triton is slow; compiled per shape)."""
    global _kernel
    if _kernel is None:
        from infera.engine.vllm.worker.gpu.kernel_triton import page_copy

        _kernel = page_copy
    return _kernel


class PageKernel:
    """The per-layer table of one :class:`KVLayout` and the launches over it."""

    def __init__(self, layout: KVLayout, bpc: int, chunk_bytes: int) -> None:
        layers = layout.layers
        offs, pos = [], 0
        for lb in layers:
            offs.append(pos)
            pos += bpc * lb.page_bytes
        sizes = [chunk_bytes, *offs]
        for lb in layers:
            sizes += [lb.page_bytes, lb.block_stride, lb.view.data_ptr()]
        self.dtype = next(
            d for d in _WIDE if all(s % torch.empty(0, dtype=d).element_size() == 0 for s in sizes)
        )
        w = torch.empty(0, dtype=self.dtype).element_size()
        dev = layout.device
        self.ptrs = torch.tensor([lb.view.data_ptr() for lb in layers], dtype=torch.int64, device=dev)
        self.strides = torch.tensor([lb.block_stride // w for lb in layers], dtype=torch.int64, device=dev)
        self.offs = torch.tensor([o // w for o in offs], dtype=torch.int64, device=dev)
        self.pages = torch.tensor([lb.page_bytes // w for lb in layers], dtype=torch.int64, device=dev)
        self.n_layers = len(layers)
        self.bpc = bpc
        self.chunk_elems = chunk_bytes // w
        biggest = max(lb.page_bytes for lb in layers) // w
        self.block = max(32, min(2048, 1 << max(0, biggest - 1).bit_length()))
        self.kernel = _build()
        self._keep = layers  # the tensors behind the table's addresses stay alive with it

    def _launch(self, blocks: torch.Tensor, slots: torch.Tensor, buf: torch.Tensor, to_buf: bool) -> None:
        n = blocks.numel()
        if n == 0:
            return
        self.kernel[(n, self.n_layers)](
            self.ptrs,
            self.strides,
            self.offs,
            self.pages,
            blocks,
            slots,
            buf.view(self.dtype),
            self.bpc,
            self.chunk_elems,
            TO_BUF=to_buf,
            BLOCK=self.block,
            num_warps=4,
        )

    def gather(self, blocks: torch.Tensor, slots: torch.Tensor, buf: torch.Tensor) -> None:
        """Pages of ``blocks`` (every layer) into staging slots ``slots`` of ``buf`` (uint8)."""
        self._launch(blocks, slots, buf, True)

    def scatter(self, blocks: torch.Tensor, slots: torch.Tensor, buf: torch.Tensor) -> None:
        """Staging slots ``slots`` of ``buf`` back into the pages of ``blocks``."""
        self._launch(blocks, slots, buf, False)


def make_page_kernel(
    layout: KVLayout, bpc: int, chunk_bytes: int, mode: str = "auto"
) -> tuple[PageKernel | None, str]:
    """A :class:`PageKernel` for ``layout``, or None and the reason the torch path is used.

    ``mode`` is ``INFERA_KVD_COPY_KERNEL``: ``auto`` uses Triton where it helps and works,
    ``triton`` insists (a failure is logged as a warning), ``torch`` never uses it."""
    if mode == "torch":
        return None, "INFERA_KVD_COPY_KERNEL=torch"
    if layout.device.type == "cpu":
        return None, "KV on the CPU"
    if layout.stacked is not None and mode == "auto":
        return None, "every layer is a view of one buffer: one torch copy already covers a group"
    try:
        kernel = PageKernel(layout, bpc, chunk_bytes)
        probe = torch.empty(chunk_bytes, dtype=torch.uint8, device=layout.device)
        ids = torch.zeros(1, dtype=torch.int64, device=layout.device)
        kernel.gather(ids, ids, probe)  # compiles now, at registration, not in a request
        kernel.scatter(ids, ids, probe)  # writes block 0 back with its own bytes
        torch.cuda.synchronize(layout.device)
    except Exception as exc:  # no triton, no compiler, an unsupported device: the torch path
        why = f"Triton page-copy kernel unavailable ({type(exc).__name__}: {str(exc)[:160]})"
        (log.warning if mode == "triton" else log.info)("infera-kvd: %s; using torch copies", why)
        return None, why
    return kernel, "triton"
