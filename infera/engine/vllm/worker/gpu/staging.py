"""What the GPU copy path moves and through what: load and save items, groups of them, the DMA
runs of a group, and the staging pool used as two halves."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_WIDE = (torch.int64, torch.int32, torch.int16)


@dataclass
class LoadItem:
    """One chunk to load: its blocks, the part to write, and where it sits in the arena."""

    block_ids: list[int]
    skip: int
    stop: int
    offset: int
    length: int


@dataclass
class SaveItem:
    """One chunk to save into a reserved arena region; ``token`` is the reservation."""

    block_ids: list[int]
    offset: int
    length: int
    token: int


def index_dtype(*sizes: int) -> torch.dtype:
    """The widest integer element that divides every size: fewer, larger index copies."""
    for dtype in _WIDE:
        width = torch.empty(0, dtype=dtype).element_size()
        if all(s % width == 0 for s in sizes):
            return dtype
    return torch.uint8


def groups_of(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``items`` in consecutive groups of ``size`` (the last one may be shorter)."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def dma_runs(group: Sequence[Any], chunk_bytes: int) -> list[tuple[int, int, int]]:
    """``(staging offset, arena offset, length)`` per DMA: chunks that sit next to each other
    in the arena as in staging move in one copy (the allocator often hands out neighbours, and
    one 2 MiB copy per chunk left a tenth of the link to launch gaps)."""
    runs: list[tuple[int, int, int]] = []
    for i, it in enumerate(group):
        lo = i * chunk_bytes
        if runs:
            plo, poff, plen = runs[-1]
            if plo + plen == lo and poff + plen == it.offset:
                runs[-1] = (plo, poff, plen + it.length)
                continue
        runs.append((lo, it.offset, it.length))
    return runs


class StagingPool:
    """A staging buffer of ``cells`` chunk-sized cells, used as two halves in turn."""

    def __init__(self, cells: int, chunk_bytes: int, device: torch.device) -> None:
        self.cells = cells
        self.half = cells // 2
        self.chunk_bytes = chunk_bytes
        self.buf = torch.empty(cells * chunk_bytes, dtype=torch.uint8, device=device)
        self.free: list[Any] = [None, None]  # event after which each half may be overwritten
        self.turn = 0

    def next_half(self) -> tuple[int, torch.Tensor]:
        h = self.turn
        self.turn ^= 1
        start = h * self.half * self.chunk_bytes
        return h, self.buf[start : start + self.half * self.chunk_bytes]
