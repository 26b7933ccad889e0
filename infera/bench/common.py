"""Helpers shared by the benchmarks: a throwaway daemon (:func:`infera.kvd.process.temp_daemon`),
timing, and the result table."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera.kvd.process import temp_daemon

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["machine_line", "median_us", "ratio_table", "temp_daemon", "timed"]


def timed(fn: Callable[[], Any], reps: int, warmup: int = 5) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` (after ``warmup`` untimed ones)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median_us(fn: Callable[[], Any], n: int, warmup: int = 20) -> float:
    return statistics.median(timed(fn, n, warmup)) * 1e6


def ratio_table(title: str, subject: str) -> Table:
    """The result table of a benchmark that measures ``subject`` against a baseline: a row per
    measure, with both figures and their ratio next to its target."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column("measure")
    t.add_column(subject, justify="right")
    t.add_column("baseline", justify="right")
    t.add_column("ratio / target", justify="right")
    return t


def machine_line() -> str:
    import platform

    return f"{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}"
