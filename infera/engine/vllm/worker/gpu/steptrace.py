"""Where a layer-wise load step's time goes, kept as worker counters (summed over steps).

A full 16k-token RAM hit on the H200 took 60 to 65 ms of vLLM step time with its DMAs at 40 ms,
and a warm GPU hit 27 to 64 ms: the gap cannot be split from vLLM's fields alone. For each
layer-wise step this marks, from the moment its first DMAs are queued (``start``):

* on the CPU: when vLLM first asked for a layer (``wait_for_layer_load``: what ran between the
  load hook and the forward), and when the step ended (``wait_for_save``: the whole forward
  queued), ``load_lw_cpu_first_wait_us`` and ``load_lw_cpu_us``;
* on the GPU, with timing events on the compute and the host-to-device streams: when the first
  DMA began and the last one ended, and when the forward ended, ``load_lw_dma_begin_us``,
  ``load_lw_dma_end_us``, ``load_lw_gpu_us``.

Read together (``benchmarks/gpu_e2e_hits.py`` prints them per hit): ``gpu - dma_end`` is the
forward left after the last byte arrived; ``dma_end - dma_begin - load_dma_us`` is how long the
DMA stream sat idle between layers (the ring or the CPU pacing it); ``cpu`` against ``gpu`` says
whether the CPU queueing the forward or the GPU running it bounds the step. Events are read on
the copier's completion thread, never waited for on the step's thread. On the CPU (synchronous
stand-ins) the GPU fields stay 0 and only the CPU ones count.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

from infera.engine.vllm.worker.gpu.runtime import Completer, HostOps

FIELDS = (
    "load_lw_traced_steps",
    "load_lw_cpu_first_wait_us",
    "load_lw_cpu_us",
    "load_lw_gpu_us",
    "load_lw_dma_begin_us",
    "load_lw_dma_end_us",
)


class StepTrace:
    """One worker's trace of its current layer-wise step (at most one at a time)."""

    def __init__(self, ops: HostOps, completer: Completer, counters: MutableMapping[str, int]) -> None:
        self.ops = ops
        self.completer = completer
        self.counters = counters
        self._clear()

    def _clear(self) -> None:
        self.t0: float | None = None
        self.start_ev: Any = None
        self.first_wait: float | None = None
        self.dma_begin: Any = None
        self.dma_end: Any = None

    @property
    def open(self) -> bool:
        return self.t0 is not None

    def begin(self) -> None:
        """The step's first DMAs are about to be queued."""
        self._clear()
        self.t0 = time.perf_counter()
        self.start_ev = self.ops.record(self.ops.current_stream(), timing=True)

    def dma(self, begin: Any, end: Any) -> None:
        """One layer's DMA was queued between the timing events ``begin`` and ``end``."""
        if self.t0 is None:
            return
        if self.dma_begin is None:
            self.dma_begin = begin
        self.dma_end = end

    def waited(self) -> None:
        """vLLM asked for a layer's KV."""
        if self.t0 is not None and self.first_wait is None:
            self.first_wait = time.perf_counter()

    def end(self) -> None:
        """The step's forward is queued (``wait_for_save``, or the next step's start)."""
        t0, start, first, begin, last = self.t0, self.start_ev, self.first_wait, self.dma_begin, self.dma_end
        self._clear()
        if t0 is None:
            return
        now = time.perf_counter()
        self._add("load_lw_traced_steps", 1)
        self._add("load_lw_cpu_us", int((now - t0) * 1e6))
        self._add("load_lw_cpu_first_wait_us", int(((first or now) - t0) * 1e6))
        ops = self.ops
        if ops.synchronous or start is None or begin is None:
            return
        stop = ops.record(ops.current_stream(), timing=True)

        def read() -> None:
            for name, a, b in (("gpu", start, stop), ("dma_begin", start, begin), ("dma_end", start, last)):
                self._add(f"load_lw_{name}_us", int(ops.elapsed_ms(a, b) * 1000))

        self.completer.after(stop, read)

    def _add(self, name: str, value: int) -> None:
        self.counters[name] = self.counters.get(name, 0) + value
