"""What the workers measure for the scheduler's cost model, and how it gets there.

The scheduler half decides per request whether loading a hit beats recomputing it
(:mod:`infera.engine.vllm.scheduler.loadcost`); the rates it needs are measured where the work
happens, in the workers, and travel back with vLLM's per-step worker metadata
(``build_connector_worker_meta`` → ``KVConnectorOutput.kv_connector_worker_meta`` →
``update_connector_output`` on the scheduler side, vLLM 0.18+): no extra socket, no daemon
round trip, and samples of every TP rank are concatenated by :meth:`KvdWorkerMeta.aggregate`.

* a **load sample**: one load step's chunks, how many of them the lookup had found only in the
  long tier, and the seconds from the LEASE to the KV being in the engine's blocks (on a GPU:
  until the copies completed, seen by the copier's completion thread);
* a **step sample**: the tokens of a step without loads and the forward's time, from
  ``bind_connector_metadata`` to ``wait_for_save`` (on a GPU: CUDA events on the compute stream,
  read once they completed, never waited for).

Timed steps also add to the worker's counters (``step_timed``, ``step_cpu_us``: bind to
``wait_for_save`` on the CPU, ``step_gpu_us``: the same on the GPU), so a warm GPU hit's forward
can be set beside a layer-wise load step's trace (:mod:`~infera.engine.vllm.worker.gpu.steptrace`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # vLLM < 0.18, or no vLLM (the copy code runs without it)

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        """Stand-in where vLLM has no worker metadata (the scheduler then keeps its defaults)."""


MAX_SAMPLES = 256  # per kind between two steps' metadata (a stalled scheduler never grows us)
MAX_PENDING = 64  # GPU step timings not yet completed


@dataclass
class KvdWorkerMeta(KVConnectorWorkerMetadata):
    """``loads``: ``(chunks, long_chunks, seconds)``; ``steps``: ``(tokens, seconds)``;
    ``chunk_bytes``: bytes of one chunk on the reporting rank (0: unknown)."""

    loads: list[tuple[int, int, float]] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)
    chunk_bytes: int = 0

    def aggregate(self, other: Any) -> KvdWorkerMeta:
        if isinstance(other, KvdWorkerMeta):
            self.loads.extend(other.loads)
            self.steps.extend(other.steps)
            self.chunk_bytes = max(self.chunk_bytes, other.chunk_bytes)
        return self


class Timings:
    """One worker's measurements until vLLM asks for this step's worker metadata."""

    def __init__(self, counters: MutableMapping[str, int] | None = None) -> None:
        self.counters: MutableMapping[str, int] = counters if counters is not None else {}
        self._lock = threading.Lock()  # load samples come from the copier's completion thread
        self.loads: list[tuple[int, int, float]] = []
        self.steps: list[tuple[int, float]] = []
        self._pending: list[tuple[int, Any, Any]] = []  # (tokens, start event, end event)
        self._step: tuple[int, float, Any] | None = None  # (tokens, wall start, start event)
        self.chunk_bytes = 0
        self._first_load_seen = False

    def load_done(self, chunks: int, long_chunks: int, seconds: float) -> None:
        if chunks <= 0:
            return
        with self._lock:
            # A process's first load pays what no later one does (the copy path's first launches
            # and mappings): H100 run M costed RAM loads from it at 7 GB/s, and auto then
            # recomputed every RAM hit up to 8k tokens. It is not a sample.
            if not self._first_load_seen:
                self._first_load_seen = True
                self.counters["timing_first_load_dropped"] = 1
                return
            if len(self.loads) < MAX_SAMPLES:
                self.loads.append((chunks, long_chunks, seconds))

    def step_started(self, tokens: int, cuda_device: Any = None) -> None:
        """A step without loads begins (``cuda_device``: time it with CUDA events there)."""
        self._step = None
        if tokens <= 0:
            return
        start = None
        if cuda_device is not None:
            import torch

            if len(self._pending) >= MAX_PENDING:
                return
            with torch.cuda.device(cuda_device):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
        self._step = (tokens, time.perf_counter(), start)

    def step_ended(self) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        tokens, wall, start = step
        cpu_s = time.perf_counter() - wall
        self._count("step_timed", 1)
        self._count("step_cpu_us", int(cpu_s * 1e6))
        if start is None:
            self._add_step(tokens, cpu_s)
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((tokens, start, end))

    def _add_step(self, tokens: int, seconds: float) -> None:
        if len(self.steps) < MAX_SAMPLES:
            self.steps.append((tokens, seconds))

    def _collect(self) -> None:
        while self._pending and self._pending[0][2].query():
            tokens, start, end = self._pending.pop(0)
            seconds = start.elapsed_time(end) / 1000.0
            self._count("step_gpu_us", int(seconds * 1e6))
            self._add_step(tokens, seconds)

    def _count(self, name: str, value: int) -> None:
        self.counters[name] = self.counters.get(name, 0) + value

    def take(self) -> KvdWorkerMeta | None:
        """What was measured since the last call, or None (nothing to send)."""
        try:
            self._collect()
        except Exception:  # a timing must never fail a step
            self._pending.clear()
        with self._lock:
            loads, self.loads = self.loads, []
        steps, self.steps = self.steps, []
        if not loads and not steps:
            return None
        return KvdWorkerMeta(loads=loads, steps=steps, chunk_bytes=self.chunk_bytes)
