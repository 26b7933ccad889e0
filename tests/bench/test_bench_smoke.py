"""The CPU benchmarks run end to end at toy sizes: real daemons, real files, a real Mooncake.

These do not judge speed (figures from timed unit tests on a shared 2-core machine would mean
nothing); they check that each ``kvd bench`` command still runs, prints one JSON object on
stdout with its ratios computed from both sides of the same run, and verifies what it moved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infera.bench.services import find_program


def bench(*args: str, timeout: float = 240) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "infera.cli", "bench", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


def test_bench_arena_reports_both_sides_and_the_latencies() -> None:
    res = bench("arena", "--chunk-size", "256K", "--rounds", "16", "--index-chunks", "3000")
    assert res["chunk_bytes"] == 256 << 10
    for side in ("memcpy_gbps", "kvd_gbps", "kvd_no_poll_gbps"):
        assert res[side] > 0, side
    assert res["put_get_ratio"] == pytest.approx(res["kvd_gbps"] / res["memcpy_gbps"])
    assert res["put_get_ratio_no_poll"] == pytest.approx(res["kvd_no_poll_gbps"] / res["memcpy_gbps"])
    assert len(res["put_get_ratio_rounds"]) == 5
    assert res["step_chunks"] == 8 and res["kvd_step_gbps"] > 0 and res["memcpy_step_gbps"] > 0
    assert res["put_get_ratio_step"] == pytest.approx(res["kvd_step_gbps"] / res["memcpy_step_gbps"])
    assert res["ping_p50_us"] > 0 and res["get_p50_us"] > 0 and res["lookup1000_p50_us"] > 0
    # 3,000 index entries grow the daemon by something, and by far less than their payload copies
    assert 0 < res["daemon_bytes_per_100k_chunks"] < 2e9


def test_bench_disk_runs_every_part_on_the_given_filesystem(tmp_path: Path) -> None:
    res = bench("disk", "--path", str(tmp_path), "--chunks", "4", "--chunk-size", "512K", "--files", "300")
    assert res["path"] == str(tmp_path) and res["chunks"] == 4
    for k in ("raw_write_gbps", "tier_write_gbps", "raw_read_gbps", "tier_read_gbps", "raw_files_read_gbps"):
        assert res[k] > 0, k
    assert res["write_ratio"] == pytest.approx(res["tier_write_gbps"] / res["raw_write_gbps"])
    assert res["read_ratio"] == pytest.approx(res["tier_read_gbps"] / res["raw_read_gbps"])
    assert res["files"] == 300
    start = res["start_with_files"]
    assert 0 < start["serving_s"] <= start["loaded_s"]
    assert not list(tmp_path.iterdir()), "the benchmark cleans up after itself"


@pytest.mark.skipif(find_program("mooncake_master") is None, reason="mooncake_master is not installed")
def test_bench_l4_moves_every_chunk_through_mooncake() -> None:
    res = bench("l4", "--chunk-size", "256K", "--count", "4", "--rounds", "2", "--batch", "2")
    assert res["chunks"] == 4 and res["rounds"] == 2
    assert isinstance(res["postponed_writes"], int)  # refused-then-retried writes are counted, not fatal
    for op in ("put", "get"):
        assert res[f"kvd_{op}_mib_s"] > 0 and res[f"mooncake_{op}_mib_s"] > 0
        assert len(res[f"{op}_ratio_rounds"]) == 2
