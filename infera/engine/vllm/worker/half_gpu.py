"""The worker half's GPU pieces (a mixin of :class:`~infera.engine.vllm.worker.half.WorkerHalf`).

Setting up the GPU copy path and GPU-direct, and the GPU version of load: the same daemon calls
as the CPU path (LEASE/RELEASE), with the copies queued on side streams by
:class:`~infera.engine.vllm.worker.gpu.copier.GpuCopier` and the daemon told only once they
completed. The GPU version of save is :mod:`~infera.engine.vllm.worker.half_gpu_save`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from typing import Any

import torch

from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.groups import Plan
from infera.engine.vllm.keys import Namespace
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, RequestJob
from infera.engine.vllm.worker.gpu import gpudirect
from infera.engine.vllm.worker.gpu.copier import ArenaPin, GpuCopier, LoadItem
from infera.engine.vllm.worker.gpu.gdpath import GdPath
from infera.engine.vllm.worker.gpu.layerwise_gpu import GpuLayerwise
from infera.engine.vllm.worker.layout import KVLayout, LayoutError
from infera.engine.vllm.worker.timing import Timings
from infera.kvd.client import KvdClient, KvdClientError

log = logging.getLogger("infera.engine.vllm")


class GpuWorkerMixin:
    ns: Namespace
    env: ConnectorEnv
    link: DaemonLink
    block_size: int
    counters: Counter[str]
    arena: torch.Tensor | None
    gpu: GpuCopier | None
    gpu_error: str | None
    pin: ArenaPin
    gd: GdPath | None
    gd_sel: gpudirect.Selection | None
    gpu_path_on_cpu: bool
    plan: Plan
    layout: KVLayout | None
    layouts: dict[int, KVLayout | None]
    gpus: dict[int, GpuCopier]
    timings: Timings
    gpu_layerwise: GpuLayerwise | None

    def _fail_chunk(self, block_ids: list[int], why: str) -> None:  # provided by LoadMixin
        raise NotImplementedError

    def _job_done(self, job: RequestJob, failed: bool) -> None:  # provided by LoadMixin
        raise NotImplementedError

    def _warn_once(self, what: str, message: str) -> None:  # provided by WorkerHalf
        raise NotImplementedError

    def _refused(self, why: str, length: int) -> None:  # provided by WorkerHalf
        raise NotImplementedError

    def _load_failures(self) -> int:
        return sum(v for k, v in self.counters.items() if k.startswith("load_failed_"))

    def _setup_gpus(self) -> None:
        """One copier per offloaded group with layers here (the staging split between them);
        GPU-direct only for single-group engines."""
        if not self.plan.hybrid:
            assert self.layout is not None
            self._setup_gpu(self.layout)
            if self.gpu is not None:
                self.gpus = {self.plan.groups[0].index: self.gpu}
            return
        ct = self.ns.chunk_tokens
        present = [(g, self.layouts.get(g.index)) for g in self.plan.offloaded]
        present = [(g, lay) for g, lay in present if lay is not None]
        share = max(1, self.env.gpu_staging_bytes // max(1, len(present)))
        gpus: dict[int, GpuCopier] = {}
        try:
            for g, lay in present:
                assert lay is not None
                gpus[g.index] = GpuCopier(
                    lay, g.stored_blocks(ct), staging_bytes=share, kernel_mode=self.env.copy_kernel
                )
        except (RuntimeError, LayoutError) as exc:
            for gpu in gpus.values():
                gpu.close()
            self.gpu_error = f"no GPU staging ({exc}); plain copies without side streams"
            return
        self.gpus = gpus
        self.gpu = next(iter(gpus.values()))
        log.info("infera-kvd: %d KV cache groups, each: %s", len(gpus), self.gpu.describe())
        if self.env.gpu_direct_requested:
            self.gd_sel = gpudirect.Selection(
                requested=True,
                loud=self.env.ais == "1",
                reasons=["GPU-direct is for single-group engines; this model has several KV cache groups"],
            )

    def _setup_gpu(self, layout: KVLayout) -> None:
        bpc = max(1, self.ns.chunk_tokens // self.block_size)
        try:
            self.gpu = GpuCopier(
                layout, bpc, staging_bytes=self.env.gpu_staging_bytes, kernel_mode=self.env.copy_kernel
            )
            log.info("infera-kvd: %s", self.gpu.describe())
        except (RuntimeError, LayoutError) as exc:  # out of GPU memory for staging, odd layout
            self.gpu_error = f"no GPU staging ({exc}); plain copies without side streams"
            return
        if not self.env.gpu_direct_requested:
            return
        self.gd_sel = gpudirect.select(
            self.env.ais,
            self.env.hipfile_roots,
            device_type="cuda" if self.gpu_path_on_cpu else layout.device.type,
            rocm=getattr(torch.version, "hip", None) is not None,
            chunk_bytes=self.gpu.chunk_bytes,
        )
        if self.gd_sel.active:
            try:
                self.gd = GdPath(self.gd_sel, self.gpu, self.ns.name)
            except RuntimeError as exc:
                self.gd_sel.reasons.append(f"no GPU memory for the write pool ({exc})")
                self.gd_sel.api = None

    def _setup_gpu_layerwise(self) -> str | None:
        """Layer-wise loads on the GPU path (single-group engines); the reason when there are none."""
        on_failed = functools.partial(self._fail_chunk, why="bad_chunk")
        self.gpu_layerwise, why = GpuLayerwise.create(self.gpu, self.plan.hybrid, self.counters, on_failed)
        return why

    def _log_paths(self) -> None:
        if self.gpu_error:
            log.warning("infera-kvd: %s", self.gpu_error)
        if self.gpu is not None and not self.pin.pinned and self.arena is not None:
            log.warning(
                "infera-kvd: the arena is not registered with the GPU (%s); KV copies run at "
                "pageable-memory speed, about a tenth of the link",
                self.pin.error,
            )
        sel = self.gd_sel
        if sel is not None and sel.fallback:
            how = log.warning if sel.loud else log.info
            reasons = "; ".join(self.gd.reasons() if self.gd else sel.reasons)
            if sel.active:
                how("infera-kvd: GPU-direct runs as %s: %s", sel.path_name, reasons)
            else:
                how(
                    "infera-kvd: INFERA_KVD_AIS=%s: GPU-direct is off (%s); using the arena path",
                    self.env.ais,
                    reasons,
                )
        if self.gd is not None and not self.gd.active:
            how = log.warning if sel is not None and sel.loud else log.info
            how("infera-kvd: GPU-direct is off: %s; using the arena path", self.gd.daemon_reason)

    def _load_gpu(
        self,
        jobs: list[RequestJob],
        keys: list[bytes],
        items: list[Any],
        client: KvdClient,
        arena: torch.Tensor,
        direct: bool,
        t0: float | None = None,
        sample: tuple[int, int] = (0, 0),
    ) -> None:
        """``t0``/``sample``: when the LEASE went out and the step's (chunks, long-tier chunks),
        for the load's timing (recorded once every copy completed, if no chunk failed)."""
        assert self.gpu is not None
        hybrid = self.plan.hybrid
        failures = self._load_failures()
        started = time.perf_counter()
        tokens: list[int] = []
        ram: dict[int, list[LoadItem]] = {}
        files: list[tuple[bytes, ChunkJob, LoadItem]] = []
        pos = 0
        for job in jobs:
            failed = False
            for ch in job.chunks:
                key, item = keys[pos], items[pos]
                pos += 1
                if item is not None:
                    tokens.append(item[0])
                if (hybrid and failed) or not ch.chunk_hash or (item is None and not direct):
                    failed = True
                    self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "missing")
                    continue
                gpu = self.gpus.get(ch.group) if hybrid else self.gpu
                if gpu is None:  # a group without layers on this rank: an empty chunk
                    if item is not None and item[2] == 0 and self.layouts.get(ch.group, 1) is None:
                        continue
                    failed = True
                    self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "bad_chunk")
                    continue
                stop = len(ch.block_ids) if ch.stop is None else ch.stop
                try:
                    gpu.check(ch.block_ids, gpu.chunk_bytes if item is None else item[2])
                except LayoutError as exc:
                    self._warn_once(
                        "load-layout", f"infera-kvd: a stored chunk does not fit this engine: {exc}"
                    )
                    failed = True
                    self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "bad_chunk")
                    continue
                if item is None:
                    files.append((key, ch, LoadItem(ch.block_ids, ch.skip, stop, 0, gpu.chunk_bytes)))
                else:
                    ram.setdefault(ch.group if hybrid else 0, []).append(
                        LoadItem(ch.block_ids, ch.skip, stop, item[1], item[2])
                    )
            self._job_done(job, failed)
        link = self.link
        left = [max(1, len(ram))]
        lock = threading.Lock()
        timings = self.timings
        clean = not files and failures == self._load_failures()

        def release(timed: bool = True) -> None:
            with lock:  # the copiers' completion threads: release once every group has moved
                left[0] -= 1
                if left[0]:
                    return
            if timed and clean and t0 is not None:
                timings.load_done(*sample, time.perf_counter() - t0)
            try:
                client.release(tokens)
            except KvdClientError as exc:
                if link.connected:
                    log.debug("infera-kvd: RELEASE failed: %s", exc)

        lw = self.gpu_layerwise
        if (
            lw is not None
            and not files
            and not hybrid
            and ram
            and lw.fits(len(ram[0]))
            and not lw.too_costly(ram[0])
        ):
            # layer by layer: the link's bracket stays held until the last DMA is queued
            lw.hold(self.link.using(wait=True))
            # the load's sample: the LEASE and set-up, then the DMAs' own time (not the forward
            # that paces them: timed from t0 to the end, every hit looked as slow as a recompute)
            setup_s = time.perf_counter() - t0 if t0 is not None else 0.0

            def dma_timed(dma_s: float) -> None:
                if clean and t0 is not None:
                    timings.load_done(*sample, setup_s + dma_s)

            lw.start(ram[0], arena, lambda: release(timed=False), dma_timed)
            self.counters["load_chunks"] += len(ram[0])
            self.counters["load_bytes"] += sum(it.length for it in ram[0])
            self.counters["load_us"] += int((time.perf_counter() - started) * 1e6)
            return
        if lw is not None and ram:
            self.counters["load_layerwise_whole_steps"] += 1  # GPU-direct, too big, too small, scattered
        if not ram:
            self.gpu.load([], arena, release)
        for group, group_items in ram.items():
            gpu = self.gpus.get(group, self.gpu) if hybrid else self.gpu
            assert gpu is not None
            gpu.load(group_items, arena, release)
            self.counters["load_chunks"] += len(group_items)
            self.counters["load_bytes"] += sum(it.length for it in group_items)
        gpu = self.gpu
        if files:
            gd = self.gd
            assert gd is not None
            ok = gpu.load_staged([f[2] for f in files], lambda i, _it, out: gd.read_into(files[i][0], out))
            retry: list[tuple[bytes, ChunkJob, LoadItem]] = []
            for f, good in zip(files, ok, strict=True):
                if good:
                    self.counters["load_direct_chunks"] += 1
                    self.counters["load_direct_bytes"] += f[2].length
                else:
                    retry.append(f)
            if retry:  # the daemon may still serve it (it reads files itself): a miss costs more
                self._load_via_daemon(retry, client, arena)
        self.counters["load_us"] += int((time.perf_counter() - started) * 1e6)

    def _load_via_daemon(
        self, chunks: list[tuple[bytes, ChunkJob, LoadItem]], client: KvdClient, arena: torch.Tensor
    ) -> None:
        gpu = self.gpu
        assert gpu is not None
        self.counters["load_direct_retried"] += len(chunks)
        try:
            items = client.lease([c[0] for c in chunks])
        except KvdClientError:
            items = [None] * len(chunks)
        tokens = [i[0] for i in items if i is not None]
        loads = []
        for (_key, ch, it), item in zip(chunks, items, strict=True):
            if item is None or item[2] != it.length:
                self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "missing")
                continue
            loads.append(LoadItem(it.block_ids, it.skip, it.stop, item[1], item[2]))

        def release() -> None:
            try:
                client.release(tokens)
            except KvdClientError:
                pass

        gpu.load(loads, arena, release)
        self.counters["load_chunks"] += len(loads)
        self.counters["load_bytes"] += sum(it.length for it in loads)
