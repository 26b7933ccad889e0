"""Writer and reader threads of the long-tier pipelines (:mod:`.pipeline`, :mod:`.promotions`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class Workers:
    """``n`` daemon threads running ``fn(job)``; lane-per-thread (ordered) or one shared queue."""

    def __init__(self, name: str, n: int, fn: Callable[[Any], None], lanes: bool, log: logging.Logger):
        self._fn = fn
        self._log = log
        count = max(1, n)
        self.queues: list[queue.SimpleQueue[Any]] = [
            queue.SimpleQueue() for _ in range(count if lanes else 1)
        ]
        self.threads = []
        for i in range(count):
            q = self.queues[i if lanes else 0]
            t = threading.Thread(target=self._run, args=(q,), name=f"kvd-{name}-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, q: queue.SimpleQueue[Any]) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                self._fn(job)
            except Exception:  # a bug must cost one job, never the thread
                self._log.exception("long tier worker failed on a job")

    def submit(self, job: Any, lane: int = 0) -> None:
        self.queues[lane % len(self.queues)].put(job)

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; returns False if a thread is still busy at the deadline."""
        for q in self.queues:
            for _ in range(len(self.threads) if len(self.queues) == 1 else 1):
                q.put(None)
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)


__all__ = ["Workers"]
