"""Streams, events, completion and host registration for the GPU copy path.

:class:`HostOps` stands in for streams and events when the tensors are on the CPU (everything is
done when issued), so the copy logic in :mod:`infera.engine.vllm.worker.gpu.copier` runs unchanged in tests.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

log = logging.getLogger("infera.engine.vllm")
T = TypeVar("T")


# -- streams and events ---------------------------------------------------------------------
class HostOps:
    """Streams and events for tensors on the CPU: everything is already done when issued."""

    synchronous = True

    def new_stream(self) -> Any:
        return None

    def current_stream(self) -> Any:
        return None

    def use(self, stream: Any) -> Any:
        return nullcontext()

    def record(self, stream: Any, timing: bool = False) -> Any:
        return None

    def wait(self, stream: Any, event: Any) -> None:
        return None

    def done(self, event: Any) -> bool:
        return True

    def sync(self, event: Any) -> None:
        return None

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return 0.0

    def sync_all(self) -> None:
        return None


class CudaOps(HostOps):
    """torch.cuda streams and events (ROCm builds map them to HIP)."""

    synchronous = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def record(self, stream: Any, timing: bool = False) -> Any:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream)
        return ev

    def wait(self, stream: Any, event: Any) -> None:
        if event is not None:
            stream.wait_event(event)

    def done(self, event: Any) -> bool:
        return event is None or bool(event.query())

    def sync(self, event: Any) -> None:
        if event is not None:
            event.synchronize()  # releases the GIL while it waits

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def sync_all(self) -> None:
        torch.cuda.synchronize(self.device)


def ops_for(device: torch.device) -> HostOps:
    return HostOps() if device.type == "cpu" else CudaOps(device)


# -- host registration of the arena -----------------------------------------------------------
def _code(err: Any) -> int:
    return int(getattr(err, "value", err))


def cuda_host_register(ptr: int, size: int) -> str | None:
    """Register ``size`` bytes at ``ptr`` with the GPU runtime; returns an error text or None."""
    try:
        rt = torch.cuda.cudart()
        code = _code(rt.cudaHostRegister(ptr, size, 0))
    except Exception as exc:  # no runtime binding in this torch build
        return f"cudaHostRegister is not available: {exc}"
    if code != 0:
        return f"cudaHostRegister failed with error {code}"
    return None


def cuda_host_unregister(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:
        pass


class QueueThread(Generic[T]):
    """Runs ``handle`` on each queued item in order, on one daemon thread started by the first item."""

    def __init__(self, name: str, handle: Callable[[T], None], join_timeout: float) -> None:
        self.name = name
        self.handle = handle
        self.join_timeout = join_timeout
        self._q: queue.Queue[T | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def put(self, item: T) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        self._q.put(item)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                self.handle(item)
            finally:
                self._q.task_done()

    def drain(self) -> None:
        """Wait until every queued item has been handled."""
        if self._thread is not None:
            self._q.join()

    def close(self) -> None:
        """Handle what is queued, then stop the thread (waiting ``join_timeout`` seconds at most)."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=self.join_timeout)
            self._thread = None


class Completer:
    """Runs callbacks once their GPU event has completed, in submission order, on one thread.

    Callbacks only talk to the daemon (seal, release); they never touch tensors."""

    def __init__(self, ops: HostOps) -> None:
        self.ops = ops
        self._thread = QueueThread[tuple[Any, Callable[[], None]]]("kvd-gpu-complete", self._complete, 10)
        self.errors = 0

    def after(self, event: Any, fn: Callable[[], None]) -> None:
        if self.ops.synchronous:
            self._run(fn)
            return
        self._thread.put((event, fn))

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            self.errors += 1
            log.debug("infera-kvd: a completion callback failed", exc_info=True)

    def _complete(self, item: tuple[Any, Callable[[], None]]) -> None:
        event, fn = item
        try:
            self.ops.sync(event)
        except Exception:
            log.exception("infera-kvd: waiting for a GPU copy failed")
        self._run(fn)

    def drain(self) -> None:
        """Wait until every queued callback has run."""
        self._thread.drain()

    def close(self) -> None:
        self._thread.close()


@dataclass
class Registered:
    ptr: int
    size: int


class ArenaPin:
    """Registration of one arena mapping, with the outcome kept for reports."""

    def __init__(
        self,
        enabled: bool = True,
        register: Callable[[int, int], str | None] = cuda_host_register,
        unregister: Callable[[int], None] = cuda_host_unregister,
    ) -> None:
        self.enabled = enabled
        self._register = register
        self._unregister = unregister
        self.current: Registered | None = None
        self.error: str | None = None
        self.seconds = 0.0

    def attach(self, arena: torch.Tensor) -> None:
        self.detach()
        if not self.enabled:
            self.error = "host registration is off (INFERA_KVD_REGISTER=0)"
            return
        ptr, size = arena.data_ptr(), arena.numel()
        started = time.perf_counter()
        err = self._register(ptr, size)
        self.seconds = time.perf_counter() - started
        if err is None:
            self.current = Registered(ptr, size)
            self.error = None
            log.info(
                "infera-kvd: registered the %.1f GiB arena mapping with the GPU in %.2f s",
                size / (1 << 30),
                self.seconds,
            )
        else:
            self.error = err

    def detach(self) -> None:
        if self.current is not None:
            self._unregister(self.current.ptr)
            self.current = None

    @property
    def pinned(self) -> bool:
        return self.current is not None


@contextmanager
def timed(counters: dict[str, int], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        counters[name] = counters.get(name, 0) + int((time.perf_counter() - started) * 1e6)
