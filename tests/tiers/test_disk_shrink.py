"""A restart with a --long-bytes below what the disk tier holds: the files over it are deleted, as
docs/disk-tier.md says, and the log says so with a WARNING (how many, how much, and why), since a
capacity typed too small (256M for 256G) would otherwise empty a cache with one INFO line."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from test_disk_tier import NS, chunk_files, disk_daemon, long_stats, on_disk, wait_ready

from helpers import Daemon
from infera.kvd import chunkfile as cf
from infera.kvd.process import wait_until

SIZE = 256 << 10


@pytest.fixture
def root(short_tmp: Path) -> Path:
    return short_tmp / "long"


def test_a_smaller_capacity_at_start_warns_what_it_evicts(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d = disk_daemon(start_daemon, root, "16M", "16M")
    on_disk(d, 8, SIZE)
    d.stop()
    assert len(chunk_files(root)) == 8
    d.args = ["--max-bytes", "16M", "--long-path", str(root), "--long-bytes", "1M"]
    d.start()
    with d.client(namespace=NS) as c:
        wait_ready(c)
        kept = long_stats(c)["chunks"]
    assert kept == (1 << 20) // (cf.HEADER_SIZE + SIZE)  # as many as 1 MiB holds
    # the index drops them at once; the files go on the writer lanes, after any queued write
    wait_until(lambda: len(chunk_files(root)) == kept, 10, f"{kept} chunk files left")
    warnings = [ln for ln in d.log().splitlines() if " WARNING " in ln and "--long-bytes" in ln]
    assert len(warnings) == 1, d.log()[-2000:]
    m = re.search(
        r"--long-bytes 1\.0 MiB is below the ([\d.]+) MiB of chunk files on disk: evicted (\d+) of 8 "
        r"chunk files \(([\d.]+) MiB\) at start, least recently used first",
        warnings[0],
    )
    assert m, warnings[0]
    assert int(m.group(2)) == 8 - kept


def test_a_capacity_that_holds_everything_says_nothing(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d = disk_daemon(start_daemon, root, "16M", "16M")
    on_disk(d, 4, SIZE)
    d.stop()
    d.start()
    with d.client(namespace=NS) as c:
        assert wait_ready(c)["chunks"] == 4
    assert "is below the" not in d.log()
