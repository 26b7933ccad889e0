"""Fixtures for the long-tier tests: a tiny filesystem that fills up for real."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_fs(short_tmp: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (needs root / CAP_SYS_ADMIN), unmounted afterwards."""
    mnt = short_tmp / "small"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs to fill ({res.stderr.strip() or 'mount failed'})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
