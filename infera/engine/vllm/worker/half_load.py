"""The worker half's loads (a mixin of :class:`~infera.engine.vllm.worker.half.WorkerHalf`).

One LEASE for every chunk of the step, one scatter per chunk from the arena into the engine's
blocks, one RELEASE; a chunk that cannot be loaded becomes a load error for its blocks (or, on a
hybrid model, a failed load of its request). The GPU version is :meth:`GpuWorkerMixin._load_gpu`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import torch

from infera.engine.vllm.groups import Plan
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.gpu.copier import GpuCopier
from infera.engine.vllm.worker.gpu.gdpath import GdPath
from infera.engine.vllm.worker.gpu.layerwise_gpu import GpuLayerwise
from infera.engine.vllm.worker.layerwise import LayerwiseLoads
from infera.engine.vllm.worker.layout import KVLayout, LayoutError
from infera.engine.vllm.worker.timing import Timings
from infera.kvd.client import KvdClient, KvdClientError

log = logging.getLogger("infera.engine.vllm")


class LoadMixin:
    link: DaemonLink
    plan: Plan
    failure: str
    layout: KVLayout | None
    layouts: dict[int, KVLayout | None]
    arena: torch.Tensor | None
    gpu: GpuCopier | None
    gd: GdPath | None
    counters: Counter[str]
    timings: Timings
    layerwise: LayerwiseLoads | GpuLayerwise | None
    gpu_layerwise: GpuLayerwise | None
    load_errors: set[int]
    finished_loads: set[str]
    failed_loads: set[str]
    # provided by WorkerHalf and its GPU mixin (annotations only: nothing here shadows them)
    key: Callable[[ChunkJob], bytes]
    _copiers: Callable[[], list[GpuCopier]]
    _load_gpu: Callable[..., None]
    _warn_once: Callable[[str, str], None]

    def load(self, meta: InferaKvdMetadata) -> None:
        self.finish_layers()  # a step that ended without wait_for_save: its copies first
        for gpu in self._copiers():
            gpu.before_forward()
        if not meta.loads:
            return
        # A load waits for a reconnect under way (the new arena's registration): the scheduler
        # has already promised these tokens to vLLM. On the H200 a step that instead reported
        # them as load errors while a 17.5 GiB arena registered got wrong greedy tokens from
        # vLLM 0.26 (docs/gpu.md); waiting is what every earlier GPU run did, and was exact.
        with self.link.using(wait=True) as usable:
            if not usable:
                self._fail_all(meta.loads)
                return
            try:
                self._load(meta.loads)
            except Exception:  # never into vLLM: the blocks are recomputed instead
                log.exception("infera-kvd: load failed; recomputing those blocks")
                self._fail_all(meta.loads)

    def _load(self, jobs: list[RequestJob]) -> None:
        if self.layout is None:
            self._fail_all(jobs)
            return
        run = [job for job in jobs if not job.fail]
        for job in jobs:
            if job.fail:
                self._job_failed(job, "unplanned")
        keys = [self.key(ch) for job in run for ch in job.chunks]
        direct = self.gd is not None and self.gd.active
        t0 = time.perf_counter()
        try:
            client, items = self.link.call(lambda c: (c, c.lease(keys, ram_only=direct)))
        except KvdClientError:
            self._fail_all(run)
            return
        self.counters["load_lease_us"] += int((time.perf_counter() - t0) * 1e6)
        arena = self.arena
        if arena is None:
            self._fail_all(run)
            return
        sample = _load_shape(run)
        if self.gpu is not None:
            self._load_gpu(run, keys, items, client, arena, direct, t0=t0, sample=sample)
            return
        tokens: list[int] = []
        pos = 0
        started = time.perf_counter()
        all_ok = True
        for job in run:
            failed = False
            for ch in job.chunks:
                item = items[pos]
                pos += 1
                if item is not None:
                    tokens.append(item[0])
                if failed or item is None or not ch.chunk_hash:
                    failed = True
                    self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "missing")
                    continue
                _token, off, length = item
                layout = self.layouts.get(ch.group, self.layout) if self.plan.hybrid else self.layout
                try:
                    if layout is None:  # a group without layers on this rank: an empty chunk
                        if length:
                            raise LayoutError(f"{length} bytes for a group without layers here")
                    elif isinstance(self.layerwise, LayerwiseLoads):  # checked now, copied per layer
                        self.layerwise.add(ch.block_ids, arena[off : off + length], ch.skip, ch.stop)
                    else:
                        layout.scatter(ch.block_ids, arena[off : off + length], ch.skip, ch.stop)
                except LayoutError as exc:
                    failed = True
                    self._warn_once(
                        "load-layout", f"infera-kvd: a stored chunk does not fit this engine: {exc}"
                    )
                    self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "bad_chunk")
                    continue
                self.counters["load_chunks"] += 1
                self.counters["load_bytes"] += length
            self._job_done(job, failed)
            all_ok = all_ok and not failed
        self.counters["load_us"] += int((time.perf_counter() - started) * 1e6)
        if isinstance(self.layerwise, LayerwiseLoads) and self.layerwise.active:
            # the leases and the arena mapping stay until the last layer is copied
            self.layerwise.hold(self.link.using(wait=True))
            self.layerwise.started(lambda: self._give_back(client, tokens))
            return
        if all_ok:
            self.timings.load_done(*sample, time.perf_counter() - t0)
        self._give_back(client, tokens)

    def _give_back(self, client: KvdClient, tokens: list[int]) -> None:
        try:
            client.release(tokens)
        except KvdClientError as exc:
            if self.link.connected:
                self.link.failed(exc)

    def wait_layer(self, layer_name: str) -> None:
        """vLLM's ``wait_for_layer_load``: a layer-wise load copies that layer now."""
        if self.layerwise is not None and self.layerwise.active:
            try:
                self.layerwise.wait(layer_name)
            except Exception:
                log.exception("infera-kvd: a layer-wise copy failed")
                self.layerwise.finish()

    def finish_layers(self) -> None:
        """Copy what a layer-wise load still holds and give its leases back."""
        if self.layerwise is not None and self.layerwise.active:
            self.layerwise.finish()
        if self.gpu_layerwise is not None:  # the step's forward is queued: its trace ends
            self.gpu_layerwise.trace.end()

    def _fail_chunk(self, block_ids: list[int], why: str) -> None:
        if self.failure == "blocks":
            self.load_errors.update(block_ids)
        self.counters[f"load_failed_{why}"] += 1

    def _job_done(self, job: RequestJob, failed: bool) -> None:
        """A request's load is over: tell vLLM (asynchronous loads), or say what cannot be told."""
        if failed and self.failure == "none":
            self.counters["load_failed_unreported"] += 1
            log.error(
                "infera-kvd: the load of request %s failed on a hybrid model, and this vLLM cannot "
                "recompute it (vLLM 0.30+ takes failures per request); its output may be wrong",
                job.req_id,
            )
        if job.notify:
            self.finished_loads.add(job.req_id)
            if failed:
                self.failed_loads.add(job.req_id)

    def _job_failed(self, job: RequestJob, why: str) -> None:
        for ch in job.chunks:
            self._fail_chunk(ch.block_ids[ch.skip : ch.stop], why)
        if not job.chunks:
            self.counters[f"load_failed_{why}"] += 1
        self._job_done(job, True)

    def _fail_all(self, jobs: list[RequestJob]) -> None:
        for job in jobs:
            self._job_failed(job, "unavailable")

    def take_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def take_finished_loads(self) -> tuple[set[str], set[str]]:
        """(requests whose asynchronous load ended, those of them that failed) since last asked."""
        done, failed = self.finished_loads, self.failed_loads
        self.finished_loads, self.failed_loads = set(), set()
        return done, failed

    def step_started(self, meta: InferaKvdMetadata) -> None:
        """vLLM bound this step's metadata: time the forward of a step without loads."""
        if meta.loads or self.layout is None:
            self.timings.step_started(0)
            return
        dev = self.layout.device
        self.timings.step_started(meta.step_tokens, dev if dev.type == "cuda" else None)


def _load_shape(jobs: list[RequestJob]) -> tuple[int, int]:
    """(chunks, chunks the lookup found only in the long tier) of one load step."""
    chunks = {ch.chunk_hash: ch.long for job in jobs for ch in job.chunks if ch.chunk_hash}
    return len(chunks), sum(chunks.values())
