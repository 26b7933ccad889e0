"""The worker half: copies between the engine's KV blocks and the daemon's shared arena.

One instance per worker process (per TP/PP rank). Loads run in ``start_load_kv``, before the
forward pass that needs them: one GET for every chunk of the step, one scatter per chunk
straight from the arena into the engine's blocks, one RELEASE. Saves run in ``wait_for_save``,
after the forward pass wrote the KV: one PUT (reserve) per retention class, one gather per chunk
straight into the reserved arena region, one SEAL. No staging copies on the CPU path.

KV on a GPU takes :mod:`infera.engine.vllm.worker.gpu.copier` instead (registered arena, side streams, one DMA
per chunk through GPU staging; RELEASE and SEAL once the DMAs completed), and, when asked for
and available, GPU-direct file reads and writes (:mod:`infera.engine.vllm.worker.gpu.gdpath`).

A hybrid model (several KV cache groups) has one layout per group and one key per chunk per
group (:mod:`infera.engine.vllm.groups`); each job names its group. A pipeline stage without
layers of a group stores an empty chunk for it, so the scheduler's keys are the same on every rank.

A chunk that cannot be loaded (gone, wrong size, daemon down) becomes a load error for its blocks,
which vLLM recomputes; on a hybrid model the whole request's load fails instead (reported as a
failed receive of an asynchronous load, which vLLM recomputes from scratch), since vLLM cannot map
block ids of several groups back to requests. Nothing here raises into vLLM.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from infera.engine.vllm import formats, groups
from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.groups import Plan
from infera.engine.vllm.keys import Namespace, chunk_keyer
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.gpu import gpudirect
from infera.engine.vllm.worker.gpu.copier import ArenaPin, GpuCopier
from infera.engine.vllm.worker.gpu.gdpath import GdPath
from infera.engine.vllm.worker.gpu.layerwise_gpu import GpuLayerwise
from infera.engine.vllm.worker.half_gpu import GpuWorkerMixin
from infera.engine.vllm.worker.half_gpu_save import GpuSaveMixin
from infera.engine.vllm.worker.half_load import LoadMixin
from infera.engine.vllm.worker.layerwise import LayerwiseLoads
from infera.engine.vllm.worker.layout import KVLayout, LayoutError
from infera.engine.vllm.worker.timing import Timings
from infera.kvd.client import KvdClient, KvdClientError, KvdUnavailable

log = logging.getLogger("infera.engine.vllm")


class WorkerHalf(LoadMixin, GpuWorkerMixin, GpuSaveMixin):
    def __init__(
        self,
        namespace: Namespace,
        env: ConnectorEnv,
        *,
        rank: int,
        replicated: bool,
        link: DaemonLink,
        blockers: list[formats.LayerFormat],
        num_blocks: int | None,
        block_size: int,
        gpu_path_on_cpu: bool = False,
        plan: Plan | None = None,
        failure: str = "blocks",
    ) -> None:
        self.ns = namespace
        self.env = env
        self.rank = rank
        self.key_rank = 0 if replicated else rank
        self.saves_here = not replicated or rank == 0
        self.link = link
        link.on_connect = self._on_connect
        link.on_disconnect = self._on_disconnect
        self.blockers = blockers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.plan = plan or groups.single_group(block_size, namespace.chunk_tokens)
        # how a failed load reaches vLLM (see scheduler.half: FAIL_BLOCKS / _REQUESTS / _NONE)
        self.failure = failure if self.plan.hybrid else "blocks"
        self.tags = {g.index: self.plan.tag(g.index) for g in self.plan.groups}
        self._keyers: dict[tuple[bytes, int, int], Callable[[bytes], bytes]] = {}
        self.layout: KVLayout | None = None  # group 0's (the only one of a single-group engine)
        # per offloaded group: its layout, or None where this rank has no layers of it
        self.layouts: dict[int, KVLayout | None] = {}
        self.gpus: dict[int, GpuCopier] = {}
        self.finished_loads: set[str] = set()
        self.failed_loads: set[str] = set()
        self.arena: torch.Tensor | None = None
        self.disabled_reason: str | None = None
        self.load_errors: set[int] = set()
        self.counters: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._last_report = 0.0
        self.gpu: GpuCopier | None = None
        self.gpu_error: str | None = None
        self.pin = ArenaPin(enabled=env.register)
        self.gd: GdPath | None = None
        self.gd_sel: gpudirect.Selection | None = None
        # tests and dry runs: run the GPU copy path's code on CPU tensors (synchronous stand-ins)
        self.gpu_path_on_cpu = gpu_path_on_cpu
        self.timings = Timings(self.counters)  # load and step times for the scheduler's cost model
        # INFERA_KVD_LOAD_LAYERWISE=1: the CPU path's or the GPU path's (then also gpu_layerwise)
        self.layerwise: LayerwiseLoads | GpuLayerwise | None = None
        self.gpu_layerwise: GpuLayerwise | None = None

    # -- registration ------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for fmt in self.blockers:
            log.warning(formats.skip_message(fmt))
        if self.blockers:
            self.disabled_reason = "a layer's KV format cannot be offloaded; a hit needs every layer"
            log.warning("infera-kvd: offload is off for this engine: %s", self.disabled_reason)
            return
        try:
            self._layouts(kv_caches)
        except LayoutError as exc:
            name = str(exc).split(":", 1)[0]
            log.warning(
                formats.skip_message(formats.LayerFormat(name, False, "unsupported layout", str(exc)))
            )
            self.disabled_reason = f"unsupported KV layout: {exc}"
            log.warning("infera-kvd: offload is off for this engine: %s", self.disabled_reason)
            return
        assert self.layout is not None
        ct = self.ns.chunk_tokens
        what = self.layout.describe()
        if self.plan.hybrid:
            here = sum(1 for lay in self.layouts.values() if lay is not None)
            what = f"{len(self.plan.offloaded)} KV cache groups ({here} with layers here: {self.plan.summary()}); first: {what}"
        log.info(
            "infera-kvd: rank %d offloads %s; chunk %d tokens = %d bytes; namespace %s",
            self.rank,
            what,
            ct,
            self.chunk_bytes_total(),
            self.ns.name,
        )
        self.timings.chunk_bytes = self.chunk_bytes_total()
        if self.layout.device.type != "cpu" or self.gpu_path_on_cpu:
            self._setup_gpus()
        if self.env.load_layerwise:
            why = None
            if self.gpu is None and not self.plan.hybrid:
                self.layerwise = LayerwiseLoads(
                    self.layout, self.counters, lambda ids: self._fail_chunk(ids, "bad_chunk")
                )
            elif self.gpu is not None:
                why = self._setup_gpu_layerwise()
                self.layerwise = self.gpu_layerwise
            else:
                why = "single-group engines"
            if why:
                log.warning(
                    "infera-kvd: INFERA_KVD_LOAD_LAYERWISE=1 applies to %s; this one loads every "
                    "layer before the forward",
                    why,
                )
        with self.link.using(wait=True):
            self.link.client()
            self._log_paths()
            self._report(force=True)

    def _layouts(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """One layout per offloaded group (a single-group engine: every layer it was given)."""
        if not self.plan.hybrid:
            self.layout = KVLayout.from_caches(kv_caches, self.num_blocks)
            self.layouts = {self.plan.groups[0].index: self.layout}
            return
        for g in self.plan.offloaded:
            names = [n for n in g.layers if n in kv_caches]
            if len(names) < len(g.layers):
                missing = next(n for n in g.layers if n not in kv_caches)
                raise LayoutError(f"{missing}: in KV cache group {g.index} but not registered")
            self.layouts[g.index] = (
                KVLayout.from_caches({n: kv_caches[n] for n in names}, self.num_blocks) if names else None
            )
        present = [lay for lay in self.layouts.values() if lay is not None]
        if not present:
            raise LayoutError("no KV cache layers to offload on this rank")
        self.layout = present[0]

    def _copiers(self) -> list[GpuCopier]:
        """Every GPU copier (one per offloaded group with layers on this rank)."""
        if self.gpus:
            return list(self.gpus.values())
        return [self.gpu] if self.gpu is not None else []

    def chunk_bytes_total(self) -> int:
        """Bytes one chunk of every group takes on this rank (the payloads the daemon keeps)."""
        ct = self.ns.chunk_tokens
        total = 0
        for g in self.plan.offloaded:
            lay = self.layouts.get(g.index)
            if lay is not None:
                total += lay.chunk_bytes(g.stored_blocks(ct))
        return total

    def key(self, ch: ChunkJob) -> bytes:
        # one hash-state prefix per namespace, rank and group (a 16k hit asks for 512 keys)
        at = (self.ns.digest, self.key_rank, ch.group)
        make = self._keyers.get(at)
        if make is None:
            make = self._keyers[at] = chunk_keyer(*at[:2], self.tags.get(ch.group, b""))
        return make(ch.chunk_hash)

    def _device(self) -> Any:
        """The KV's GPU as the current device: the link's watcher thread runs the hooks below
        after a daemon restart, and a new thread's current device is GPU 0."""
        layout = self.layout
        if layout is not None and layout.device.type == "cuda":
            return torch.cuda.device(layout.device)
        return contextlib.nullcontext()

    def _on_connect(self, client: KvdClient) -> None:
        self.arena = torch.frombuffer(client.arena, dtype=torch.uint8) if client.arena_size else None
        with self._device():
            if self.gpu is not None and self.arena is not None:
                self.pin.attach(self.arena)
                if self.pin.pinned:  # every page is mapped: populating regions would only repeat it
                    client.pages_present()
        if self.gd is not None:
            self.gd.connect(client)

    def _on_disconnect(self, client: KvdClient) -> None:
        """Nothing may still be copying into or out of the mapping when it goes away."""
        with self._device():
            if self.gpu is not None:
                for gpu in self._copiers():
                    gpu.drain()
                self.pin.detach()
        if self.gd is not None:
            self.gd.drain()
        self.arena = None

    # -- saves -------------------------------------------------------------------------------
    def save(self, meta: InferaKvdMetadata) -> None:
        with self.link.using() as usable:
            if not usable:  # the link is reconnecting right now
                if meta.saves and self.saves_here:
                    self.counters["save_skipped_unavailable"] += sum(len(j.chunks) for j in meta.saves)
                return
            if meta.saves and self.saves_here and self.layout is not None:
                try:
                    self._save(meta.saves)
                except Exception:  # a lost save is a future miss, never an engine failure
                    log.exception("infera-kvd: save failed; those chunks stay uncached")
                    self.counters["save_errors"] += 1
            self._report()

    def _save(self, jobs: list[RequestJob]) -> None:
        layout = self.layout
        assert layout is not None
        # (retention, group) -> [(key, block ids)]
        by_class: dict[tuple[str, int], list[tuple[bytes, list[int]]]] = {}
        for job in jobs:
            for ch in job.chunks:
                by_class.setdefault((job.retention, ch.group), []).append((self.key(ch), ch.block_ids))
        started = time.perf_counter()
        if self.gpus:
            for (retention, group), chunks in by_class.items():
                gpu = self.gpus.get(group)
                if gpu is None:  # a group without layers on this rank: empty chunks
                    if not self._save_cpu(retention, None, chunks):
                        break
                elif not self._save_gpu(retention, chunks, gpu):
                    break
            self.counters["save_us"] += int((time.perf_counter() - started) * 1e6)
            return
        for (retention, group), chunks in by_class.items():
            lay = self.layouts.get(group, layout) if self.plan.hybrid else layout
            if self.plan.hybrid and group not in self.layouts:
                continue  # not a group this engine offloads
            if not self._save_cpu(retention, lay, chunks):
                break
        self.counters["save_us"] += int((time.perf_counter() - started) * 1e6)

    def _save_cpu(
        self, retention: str, layout: KVLayout | None, chunks: list[tuple[bytes, list[int]]]
    ) -> bool:
        """Reserve, gather, seal one retention class of one group (``layout`` None: a group this
        rank has no layers of, stored as empty chunks). False when the daemon is unreachable."""
        keys = [k for k, _ in chunks]
        lengths = [layout.chunk_bytes(len(ids)) if layout is not None else 0 for _, ids in chunks]
        try:
            client, slots = self.link.call(lambda c: (c, c.reserve(keys, lengths, retention=retention)))
            arena = self.arena
            if arena is None:
                client.abort([s[0] for s in slots if not isinstance(s, str)])
                raise KvdUnavailable("no arena mapping")
            tokens: list[int] = []
            for slot, (_key, ids), length in zip(slots, chunks, lengths, strict=True):
                if isinstance(slot, str):
                    self._refused(slot, length)
                    continue
                token, off = slot
                try:
                    if layout is not None:
                        layout.gather(ids, arena[off : off + length])
                except LayoutError as exc:
                    client.abort([token])
                    self._warn_once("save-layout", f"infera-kvd: cannot gather a chunk: {exc}")
                    continue
                tokens.append(token)
                self.counters["save_chunks"] += 1
                self.counters["save_bytes"] += length
            client.seal(tokens)
        except KvdUnavailable as exc:
            if self.link.connected:
                self.link.failed(exc)
            self.counters["save_skipped_unavailable"] += len(chunks)
            return False
        except KvdClientError as exc:
            self._warn_once("save-error", f"infera-kvd: the daemon rejected a save: {exc}")
            self.counters["save_errors"] += 1
        return True

    def _refused(self, why: str, length: int) -> None:
        """A reservation the daemon refused: counted, and a full arena said once."""
        self.counters[f"save_{why}"] += 1
        if why in ("full", "too_large", "quota"):
            self._warn_once(why, f"infera-kvd: the daemon refused a {length}-byte chunk ({why})")

    # -- reporting ---------------------------------------------------------------------------
    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message)

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < self.env.report_every_s:
            return
        self._last_report = now
        self.link.report(**self.report_fields())

    def report_fields(self) -> dict[str, Any]:
        """What the daemon shows for this worker: its data path, any fallback, its counters."""
        counters: dict[str, Any] = {**self.counters, **self.link.counters}
        reasons: list[str] = []
        path = "arena"
        if self.gpu is not None:
            for gpu in self._copiers():
                for name, value in gpu.counters.items():
                    counters[name] = counters.get(name, 0) + value
            if self.env.copy_kernel == "triton" and self.gpu.kernel is None:
                reasons.append(f"INFERA_KVD_COPY_KERNEL=triton asked for, but {self.gpu.kernel_why}")
            if self.pin.pinned:
                path = "arena-pinned"
                counters["arena_register_ms"] = int(self.pin.seconds * 1000)
            else:
                path = "arena-unpinned"
                reasons.append(f"arena not registered with the GPU: {self.pin.error or 'not connected yet'}")
        elif self.gpu_error:
            path = "arena-plain"
            reasons.append(self.gpu_error)
        fields: dict[str, Any] = {}
        sel = self.gd_sel
        if self.env.gpu_direct_requested:
            fields["requested_path"] = "gpu-direct"
            if sel is None:
                reasons.append("GPU-direct needs KV on a GPU with the GPU copy path")
            elif self.gd is not None and self.gd.active:
                path += "+" + sel.path_name
                reasons += sel.reasons
            else:
                reasons += self.gd.reasons() if self.gd is not None else sel.reasons
        if self.gd is not None:
            counters.update(self.gd.all_counters())
        fields.update(data_path=path, counters=counters, fallback=bool(reasons))
        if reasons:
            fields["fallback_reason"] = "; ".join(reasons)
        if self.disabled_reason:
            fields.update(fallback=True, fallback_reason=self.disabled_reason, data_path="none")
        return fields

    def close(self) -> None:
        self.link.close()
        for gpu in self._copiers():
            gpu.close()
        if self.gd is not None:
            self.gd.close()
        self.arena = None


def block_count(kv_cache_config: Any) -> int | None:
    value = getattr(kv_cache_config, "num_blocks", None)
    return int(value) if value else None
