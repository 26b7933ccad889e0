"""The worker half's GPU saves (a mixin of :class:`~infera.engine.vllm.worker.half.WorkerHalf`).

The same daemon calls as the CPU path's save (PUT, SEAL), with the gathers and DMAs queued on side
streams by :class:`~infera.engine.vllm.worker.gpu.copier.GpuCopier`: reservations go out one
staging group at a time, and each group is sealed once its DMA completed. With GPU-direct on,
``long`` chunks that get a slot of the write pool are also written to their files from GPU staging
(:class:`~infera.engine.vllm.worker.gpu.gdpath.GdPath`), reserved ``persisted`` so that the daemon
does not write them again.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.worker.gpu.copier import GpuCopier, SaveItem
from infera.engine.vllm.worker.gpu.gdpath import GdPath
from infera.engine.vllm.worker.layout import LayoutError
from infera.kvd.client import KvdClient, KvdClientError, KvdUnavailable


class GpuSaveMixin:
    link: DaemonLink
    counters: Counter[str]
    arena: torch.Tensor | None
    gpu: GpuCopier | None
    gd: GdPath | None
    # provided by WorkerHalf (annotations only: nothing here shadows them)
    _warn_once: Callable[[str, str], None]
    _refused: Callable[[str, int], None]

    def _save_gpu(
        self, retention: str, chunks: list[tuple[bytes, list[int]]], gpu: GpuCopier | None = None
    ) -> bool:
        """Reserve, then queue gathers and DMAs; SEAL happens when each group's DMA is done.
        Returns False when the daemon is unreachable (the remaining classes are skipped too).

        Reservations go out one staging group at a time, each group's copies queued before the
        next reservation: the GPU starts copying after one small round trip instead of waiting
        for the reservation of the whole step (3 ms for 1,024 chunks, a tenth of the DMA time
        of 2 MiB chunks)."""
        gpu = gpu or self.gpu
        assert gpu is not None
        gd = self.gd if self.gd is not None and self.gd.active and retention == "long" else None
        slots_for: dict[bytes, int] = {}
        if gd is not None:
            for key, _ids in chunks:
                free = gd.take_slot()
                if free is None:
                    break
                slots_for[key] = free
        groups = [[c for c in chunks if c[0] in slots_for], [c for c in chunks if c[0] not in slots_for]]
        keys_by_token: dict[int, bytes] = {}
        used: set[bytes] = set()
        step = max(1, gpu.save_pool.half)
        saved = saved_bytes = 0

        def hooks(client: KvdClient) -> tuple[Any, Any]:
            """SEAL and the GPU-direct file writes, on the connection that made the reservations."""

            def seal(tokens: list[int]) -> None:
                client.seal(tokens, wait=False)

            def after_gather(group: Any, region: torch.Tensor, _event: Any) -> None:
                for i, it in enumerate(group):
                    key = keys_by_token[it.token]
                    slot = slots_for.get(key)
                    if gd is not None and slot is not None:
                        used.add(key)
                        lo = i * gpu.chunk_bytes
                        gd.queue_write(client, key, slot, region[lo : lo + it.length])

            return seal, (after_gather if gd is not None else None)

        try:
            for persisted, group in zip((True, False), groups, strict=True):
                for start in range(0, len(group), step):
                    part = group[start : start + step]
                    client, items = self._reserve_part(gpu, retention, persisted, part, keys_by_token)
                    arena = self.arena
                    if client is None or not items or arena is None:
                        continue
                    gpu.save(items, arena, *hooks(client))
                    saved += len(items)
                    saved_bytes += sum(it.length for it in items)
        except KvdUnavailable as exc:
            if self.link.connected:
                self.link.failed(exc)
            self.counters["save_skipped_unavailable"] += len(chunks) - saved
            self._free_slots(gd, slots_for, used)
            self.counters["save_chunks"] += saved
            self.counters["save_bytes"] += saved_bytes
            return False
        except KvdClientError as exc:
            self._warn_once("save-error", f"infera-kvd: the daemon rejected a save: {exc}")
            self.counters["save_errors"] += 1
        self._free_slots(gd, slots_for, used)
        self.counters["save_chunks"] += saved
        self.counters["save_bytes"] += saved_bytes
        return True

    def _reserve_part(
        self,
        gpu: GpuCopier,
        retention: str,
        persisted: bool,
        part: list[tuple[bytes, list[int]]],
        keys_by_token: dict[int, bytes],
    ) -> tuple[KvdClient | None, list[SaveItem]]:
        """Reserve arena regions for ``part``; the connection, and save items for the regions
        the daemon granted."""
        keys = [k for k, _ in part]
        lengths = [gpu.chunk_bytes if len(ids) == gpu.bpc else -1 for _, ids in part]
        if any(n < 0 for n in lengths):
            self._warn_once("save-layout", "infera-kvd: a save chunk with an unexpected block count")
            return None, []
        client, slots = self.link.call(
            functools.partial(_reserve, keys=keys, lengths=lengths, retention=retention, persisted=persisted)
        )
        items: list[SaveItem] = []
        for res, (key, ids) in zip(slots, part, strict=True):
            if isinstance(res, str):
                self._refused(res, gpu.chunk_bytes)
                continue
            token, off = res
            try:
                gpu.check(ids, gpu.chunk_bytes)
            except LayoutError as exc:
                client.abort([token])
                self._warn_once("save-layout", f"infera-kvd: cannot gather a chunk: {exc}")
                continue
            items.append(SaveItem(ids, off, gpu.chunk_bytes, token))
            keys_by_token[token] = key
        return client, items

    @staticmethod
    def _free_slots(gd: GdPath | None, slots_for: dict[bytes, int], used: set[bytes]) -> None:
        if gd is None:
            return
        for key, slot in slots_for.items():
            if key not in used:
                gd._give_slot(slot)


def _reserve(
    c: KvdClient, *, keys: list[bytes], lengths: list[int], retention: str, persisted: bool
) -> tuple[KvdClient, list[tuple[int, int] | str]]:
    return c, c.reserve(keys, lengths, retention=retention, persisted=persisted)
