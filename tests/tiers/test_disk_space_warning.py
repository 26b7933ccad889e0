"""The disk tier's start-up warning when the filesystem is smaller than --long-bytes: sizes a human reads."""

from __future__ import annotations

import logging
from collections import namedtuple
from pathlib import Path

import pytest

from infera.kvd.tiers import diskfs

Usage = namedtuple("Usage", "total used free")


def test_space_warning_prints_sizes_not_raw_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(diskfs.shutil, "disk_usage", lambda _p: Usage(1 << 40, 0, 84483432448))
    with caplog.at_level(logging.WARNING, logger="infera.kvd.disk"):
        diskfs.check_space(str(tmp_path), 256 << 30)
    (record,) = caplog.records
    text = record.getMessage()
    assert "has 78.7 GiB free, less than --long-bytes 256.0 GiB" in text, text
    assert "84483432448" not in text and "274877906944" not in text


def test_no_warning_when_the_tier_fits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="infera.kvd.disk"):
        diskfs.check_space(str(tmp_path), 1 << 20)
    assert caplog.records == []
