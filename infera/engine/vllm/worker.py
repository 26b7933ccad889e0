"""The worker half: copies between the engine's KV blocks and the daemon's shared arena.

One instance per worker process (per TP/PP rank). Loads run in ``start_load_kv``, before the
forward pass that needs them: one GET for every chunk of the step, one scatter per chunk
straight from the arena into the engine's blocks, one RELEASE. Saves run in ``wait_for_save``,
after the forward pass wrote the KV: one PUT (reserve) per retention class, one gather per chunk
straight into the reserved arena region, one SEAL. No staging copies on the CPU path.

A chunk that cannot be loaded (gone, wrong size, daemon down) becomes a load error for its blocks,
which vLLM recomputes. Nothing here raises into vLLM.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import torch

from infera.engine.vllm import formats
from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.keys import Namespace, chunk_key
from infera.engine.vllm.layout import KVLayout, LayoutError
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import InferaKvdMetadata, RequestJob
from infera.kvd.client import KvdClient, KvdClientError, KvdUnavailable

log = logging.getLogger("infera.engine.vllm")

REPORT_EVERY_S = 5.0


class WorkerHalf:
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
    ) -> None:
        self.ns = namespace
        self.env = env
        self.rank = rank
        self.key_rank = 0 if replicated else rank
        self.saves_here = not replicated or rank == 0
        self.link = link
        link.on_connect = self._on_connect
        self.blockers = blockers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout: KVLayout | None = None
        self.arena: torch.Tensor | None = None
        self.disabled_reason: str | None = None
        self.load_errors: set[int] = set()
        self.counters: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._last_report = 0.0

    # -- registration ------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for fmt in self.blockers:
            log.warning(formats.skip_message(fmt))
        if self.blockers:
            self.disabled_reason = "a layer's KV format cannot be offloaded; a hit needs every layer"
            log.warning("infera-kvd: offload is off for this engine: %s", self.disabled_reason)
            return
        try:
            self.layout = KVLayout.from_caches(kv_caches, self.num_blocks)
        except LayoutError as exc:
            name = str(exc).split(":", 1)[0]
            log.warning(
                formats.skip_message(formats.LayerFormat(name, False, "unsupported layout", str(exc)))
            )
            self.disabled_reason = f"unsupported KV layout: {exc}"
            log.warning("infera-kvd: offload is off for this engine: %s", self.disabled_reason)
            return
        log.info(
            "infera-kvd: rank %d offloads %s; chunk %d tokens = %d bytes; namespace %s",
            self.rank,
            self.layout.describe(),
            self.ns.chunk_tokens,
            self.layout.chunk_bytes(self.ns.chunk_tokens // self.block_size),
            self.ns.name,
        )
        if self.env.gpu_direct_requested:
            log.warning(
                "infera-kvd: INFERA_KVD_AIS=%s asks for GPU-direct reads, which this build does not "
                "have yet; using the arena path",
                self.env.ais,
            )
        self.link.client()
        self._report(force=True)

    def _on_connect(self, client: KvdClient) -> None:
        self.arena = torch.frombuffer(client.arena, dtype=torch.uint8) if client.arena_size else None

    # -- loads -------------------------------------------------------------------------------
    def load(self, meta: InferaKvdMetadata) -> None:
        if not meta.loads:
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
        keys = [chunk_key(self.ns.digest, ch.chunk_hash, self.key_rank) for job in jobs for ch in job.chunks]
        try:
            client, items = self.link.call(lambda c: (c, c.lease(keys)))
        except KvdClientError:
            self._fail_all(jobs)
            return
        arena = self.arena
        if arena is None:
            self._fail_all(jobs)
            return
        tokens: list[int] = []
        pos = 0
        started = time.perf_counter()
        for job in jobs:
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
                try:
                    self.layout.scatter(ch.block_ids, arena[off : off + length], ch.skip, ch.stop)
                except LayoutError as exc:
                    failed = True
                    self._warn_once(
                        "load-layout", f"infera-kvd: a stored chunk does not fit this engine: {exc}"
                    )
                    self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "bad_chunk")
                    continue
                self.counters["load_chunks"] += 1
                self.counters["load_bytes"] += length
        self.counters["load_us"] += int((time.perf_counter() - started) * 1e6)
        try:
            client.release(tokens)
        except KvdClientError as exc:
            if self.link.connected:
                self.link.failed(exc)

    def _fail_chunk(self, block_ids: list[int], why: str) -> None:
        self.load_errors.update(block_ids)
        self.counters[f"load_failed_{why}"] += 1

    def _fail_all(self, jobs: list[RequestJob]) -> None:
        for job in jobs:
            for ch in job.chunks:
                self._fail_chunk(ch.block_ids[ch.skip : ch.stop], "unavailable")

    def take_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    # -- saves -------------------------------------------------------------------------------
    def save(self, meta: InferaKvdMetadata) -> None:
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
        by_retention: dict[str, list[tuple[bytes, list[int]]]] = {}
        for job in jobs:
            for ch in job.chunks:
                key = chunk_key(self.ns.digest, ch.chunk_hash, self.key_rank)
                by_retention.setdefault(job.retention, []).append((key, ch.block_ids))
        started = time.perf_counter()
        for retention, chunks in by_retention.items():
            keys = [k for k, _ in chunks]
            lengths = [layout.chunk_bytes(len(ids)) for _, ids in chunks]
            try:
                client, slots = self.link.call(lambda c: (c, c.reserve(keys, lengths, retention=retention)))  # noqa: B023
                arena = self.arena
                if arena is None:
                    client.abort([s[0] for s in slots if not isinstance(s, str)])
                    raise KvdUnavailable("no arena mapping")
                tokens: list[int] = []
                for slot, (_key, ids), length in zip(slots, chunks, lengths, strict=True):
                    if isinstance(slot, str):
                        self.counters[f"save_{slot}"] += 1
                        if slot in ("full", "too_large"):
                            self._warn_once(
                                slot, f"infera-kvd: the daemon refused a {length}-byte chunk ({slot})"
                            )
                        continue
                    token, off = slot
                    try:
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
                return
            except KvdClientError as exc:
                self._warn_once("save-error", f"infera-kvd: the daemon rejected a save: {exc}")
                self.counters["save_errors"] += 1
        self.counters["save_us"] += int((time.perf_counter() - started) * 1e6)

    # -- reporting ---------------------------------------------------------------------------
    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message)

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_EVERY_S:
            return
        self._last_report = now
        fields: dict[str, Any] = {
            "data_path": "arena",
            "counters": {**self.counters, **self.link.counters},
        }
        if self.env.gpu_direct_requested:
            fields.update(
                requested_path="gpu-direct",
                fallback=True,
                fallback_reason="GPU-direct reads are not in this build; serving through the arena",
            )
        if self.disabled_reason:
            fields.update(fallback=True, fallback_reason=self.disabled_reason, data_path="none")
        self.link.report(**fields)

    def close(self) -> None:
        self.arena = None
        self.link.close()


def block_count(kv_cache_config: Any) -> int | None:
    value = getattr(kv_cache_config, "num_blocks", None)
    return int(value) if value else None
