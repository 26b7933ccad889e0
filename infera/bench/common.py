"""Helpers shared by the benchmarks: a throwaway daemon (:func:`infera.kvd.process.temp_daemon`),
timing, and the result table."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from infera.kvd.process import temp_daemon

__all__ = ["machine_line", "median_us", "temp_daemon"]


def median_us(fn: Callable[[], Any], n: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def machine_line() -> str:
    import platform

    return f"{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}"
