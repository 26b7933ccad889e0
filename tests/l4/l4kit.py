"""What the long-tier tests against real services (Mooncake, lmcache_server) read of a daemon: its
long tier's stats, and a wait until they say something."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from promserver import assert_tier_fields_declared

from helpers import Daemon


def long_stats(d: Daemon) -> dict[str, Any]:
    with d.client(want_arena=False) as c:
        tiers: dict[str, Any] = c.stats()["tiers"]
    assert_tier_fields_declared(tiers)  # every stats read here also checks the exposition
    return tiers["long"]


def wait_long(d: Daemon, pred: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
    """The long tier's stats once ``pred`` holds for them; fails with the last stats and the end of
    the daemon's log after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        s = long_stats(d)
        if pred(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"long tier never got there; last stats: {s}\nlog:\n{d.log()[-3000:]}")
        time.sleep(0.1)
