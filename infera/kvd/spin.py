"""Whether the loop may poll after traffic instead of sleeping (``--busy-poll-us``).

Polling for a moment after a request serves the next one without a wake-up, which costs tens of
microseconds on virtual machines; one client doing put+get reaches 0.84 to 0.86 of memcpy with
the window, 0.73 without it (2-core VM). But a polling daemon holds a CPU, and when its clients
already keep every CPU busy it polls on time they need: two clients streaming put+get on two
CPUs measured 0.30 of two memcpy processes with the window and 0.62 without. So the loop polls
only while the host has a CPU to spare for it: during a window it reads the number of runnable
tasks in ``/proc/loadavg`` (one ``pread``, about half a microsecond) at most every ``CHECK_S``, and
polls only if the others (itself left out) are fewer than the CPUs it may run on; otherwise it
sleeps until the next event. Measured on the 2-core VM: looking every 5 ms kept most of the cost
(two clients 0.35 of memcpy), every 50 µs gives 0.42 to 0.50 (no window at all: 0.49 to 0.56)
while one client keeps 0.86 to 0.88; looking on every turn of the window gave the same throughput
but slowed a PING round trip from 29 to 34-46 µs (probably the cost of summing every CPU's run
queue that often). Where that file cannot be read the window works as before.
"""

from __future__ import annotations

import contextlib
import os

LOADAVG = "/proc/loadavg"
CHECK_S = 50e-6  # how often a polling loop looks at the host again


def runnable_others(text: bytes) -> int | None:
    """Runnable tasks other than the reader, from ``/proc/loadavg`` (``0.40 0.86 1.04 2/345 123``:
    the fourth field's numerator counts the reader itself); None if the text is not that."""
    fields = text.split()
    if len(fields) < 4 or b"/" not in fields[3]:
        return None
    try:
        return max(0, int(fields[3].split(b"/", 1)[0]) - 1)
    except ValueError:
        return None


class SpinGate:
    """Decides, during a poll window, whether the host has a CPU to spare for polling."""

    __slots__ = ("_fd", "_next", "allowed", "cpus", "yielded_total")

    def __init__(self, path: str = LOADAVG) -> None:
        try:
            self.cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = os.cpu_count() or 1
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._next = 0.0
        self.allowed = True
        self.yielded_total = 0  # checks that found no CPU to spare (the loop slept instead)

    def may_poll(self, now: float) -> bool:
        """Whether the host has a CPU to spare for polling (``now``: ``time.monotonic()``)."""
        if now < self._next or self._fd is None:
            return self.allowed
        self._next = now + CHECK_S
        try:
            others = runnable_others(os.pread(self._fd, 256, 0))
        except OSError:
            others = None
        self.allowed = others is None or others < self.cpus
        if not self.allowed:
            self.yielded_total += 1
        return self.allowed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
