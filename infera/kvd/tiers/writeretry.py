"""Retries of failed long-tier writes, with back-off. Knows nothing of disks or stores: keys in,
keys due out, outcomes reported back (loop thread only). Used by the write-through pipeline of
every tier (:mod:`.pipeline`).

* A chunk whose write failed is retried 1 s later, then after 2, 4, 8, 16 and 30 s (at most), as
  long as its owner still holds it (``drop`` when it leaves RAM, is deleted or overwritten).
* While the tier's last write failed, retries are probes: one at a time, the next one 1 s after
  a failed one, then 2, 4 ... 30 s. A full disk costs one failed write per probe interval, not
  one per waiting chunk. Any successful write ends probing.
* The first retry to succeed after a failed one makes every waiting chunk due at once: the
  condition is over, so nobody waits out a 30 s back-off.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

BASE_S = 1.0
MAX_S = 30.0
MAX_KEYS = 65536  # beyond that a failed chunk is only retried at a clean stop


class Retries:
    def __init__(
        self, base_s: float = BASE_S, max_s: float = MAX_S, clock: Callable[[], float] = time.monotonic
    ):
        self.base = base_s
        self.cap = max(max_s, base_s)
        self.clock = clock
        self.waiting: dict[bytes, list[float]] = {}  # key -> [due, delay, token]; due inf: in flight
        self._heap: list[tuple[float, float, bytes]] = []  # (due, token, key); stale rows skipped
        self._tokens = itertools.count()
        self.inflight = 0
        self.failing = False  # the owner's last write (any write) failed
        self._retry_failed = False  # the last retry failed
        self._probe_gap = base_s  # while failing: the wait after a failed probe (doubles)
        self._probe_at = 0.0  # while failing: no probe before this

    def __len__(self) -> int:
        return len(self.waiting)

    def __contains__(self, key: bytes) -> bool:
        return key in self.waiting

    def _schedule(self, key: bytes, entry: list[float], due: float) -> None:
        entry[0] = due
        entry[2] = float(next(self._tokens))
        heapq.heappush(self._heap, (due, entry[2], key))

    def failed(self, key: bytes, retried: bool) -> None:
        """A write of ``key`` failed (``retried``: it was a retry from :meth:`due`)."""
        self.failing = True
        now = self.clock()
        if retried:
            self.inflight -= 1
            self._retry_failed = True
            self._probe_at = now + self._probe_gap
            self._probe_gap = min(self._probe_gap * 2, self.cap)
        entry = self.waiting.get(key)
        if entry is None:
            if len(self.waiting) >= MAX_KEYS:
                return
            entry = self.waiting[key] = [0.0, self.base, 0.0]
        elif retried:
            entry[1] = min(entry[1] * 2, self.cap)
        self._schedule(key, entry, now + entry[1])

    def succeeded(self, key: bytes, retried: bool) -> bool:
        """A write of ``key`` succeeded; returns True if it had failed before (recovered)."""
        self.failing = False
        self._probe_gap = self.base
        if retried:
            self.inflight -= 1
            if self._retry_failed:
                self._retry_failed = False
                self._wake()
        return self.waiting.pop(key, None) is not None

    def skipped(self, key: bytes, retried: bool) -> None:
        """A retry did not run (the chunk went, or the write was superseded)."""
        if retried:
            self.inflight -= 1
        self.waiting.pop(key, None)

    def drop(self, key: bytes) -> None:
        """The chunk is gone (evicted, deleted, overwritten): nothing left to retry."""
        self.waiting.pop(key, None)

    def later(self, key: bytes) -> None:
        """A key :meth:`due` returned could not be queued now: due again at the next call."""
        entry = self.waiting.get(key)
        if entry is not None:
            self.inflight -= 1
            self._schedule(key, entry, self.clock())

    def _wake(self) -> None:
        now = self.clock()
        for key, entry in self.waiting.items():
            if entry[0] != float("inf"):
                self._schedule(key, entry, now)

    def due(self) -> list[bytes]:
        """Keys to retry now, oldest due first; counted in flight until reported back. While
        the owner's last write failed, at most one (a probe), and not before the probe gap."""
        now = self.clock()
        heap = self._heap
        out: list[bytes] = []
        while heap and heap[0][0] <= now:
            if self.failing and (self.inflight + len(out) >= 1 or now < self._probe_at):
                break
            _due, token, key = heapq.heappop(heap)
            entry = self.waiting.get(key)
            if entry is None or entry[2] != token:
                continue  # dropped, or rescheduled since
            entry[0] = float("inf")
            out.append(key)
        self.inflight += len(out)
        if len(heap) > 4 * len(self.waiting) + 64:  # rows of dropped keys pile up: rebuild
            self._heap = [(e[0], e[2], k) for k, e in self.waiting.items() if e[0] != float("inf")]
            heapq.heapify(self._heap)
        return out


__all__ = ["BASE_S", "MAX_S", "Retries"]
