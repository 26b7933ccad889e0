"""benchmarks/gpu_e2e_hits.py: a gpu-e2e run's per-request split, read from results.json; and
benchmarks/gpu_lane_issue19.sh's stage table stays in step with the bench's options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import benchmark_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hits() -> Any:
    return benchmark_script("gpu_e2e_hits")


HIT = {
    "ms": 171.5,
    "queue_ms": 0.4,
    "step_ms": 168.2,
    "sched_us": 4_300,
    "load_lease_us": 95_000,
    "load_us": 1751,
    "load_dma_us": 39572,
    "skipped_tokens": 0,
    "busy_threads": [["VLLM::EngineCor", 160.0], ["python", 0.0]],
}
RESULTS = {
    "records": [
        {"_kind": "INFO", "role": "kvd-a"},
        {"_kind": "RESULT", "model": "Llama", "role": "native", "tokens": 16384, "hit": [{"ms": 98.6}]},
        {
            "_kind": "RESULT",
            "model": "Llama",
            "role": "kvd-a",
            "tokens": 16384,
            "store": {"ms": 500.0},
            "hit": [HIT],
            "partial": {"1024": [{"ms": 69.6}]},
        },
        {"_kind": "RESULT", "model": "Llama", "role": "kvd-disk", "tokens": 512, "after_disk": [HIT]},
    ]
}


def test_rows_keep_every_timed_request_and_kvd_filters_to_kvd_hits(hits: Any) -> None:
    everything = hits.rows(RESULTS)
    assert [(r["role"], r["phase"]) for r in everything] == [
        ("native", "hit"),
        ("kvd-a", "store"),
        ("kvd-a", "hit"),
        ("kvd-a", "partial+1024"),
        ("kvd-disk", "after_disk"),
    ]
    kvd = hits.rows(RESULTS, kvd_only=True)
    assert [(r["role"], r["phase"]) for r in kvd] == [
        ("kvd-a", "hit"),
        ("kvd-a", "partial+1024"),
        ("kvd-disk", "after_disk"),
    ]
    assert [r["phase"] for r in hits.rows(RESULTS, tokens=512)] == ["after_disk"]


def test_render_shows_the_split_and_dashes_for_what_a_run_did_not_record(hits: Any) -> None:
    text = hits.render(hits.rows(RESULTS, kvd_only=True))
    hit_line, partial_line = text.splitlines()[1:3]
    assert "171.5" in hit_line and "168.2" in hit_line and " 95.0 " in hit_line and "39.6" in hit_line
    assert " 4.3 " in hit_line  # the connector's scheduler hooks
    assert "VLLM::EngineCor 160" in hit_line and "python" not in hit_line  # idle threads are left out
    assert "69.6" in partial_line and partial_line.count(" - ") >= 4  # an older run: no split


def test_the_path_column_says_how_each_hit_was_moved(hits: Any) -> None:
    assert hits.load_path({**HIT, "load_layerwise_steps": 1}) == "layers"
    assert hits.load_path({**HIT, "load_layerwise_scattered_steps": 1}) == "scattered"
    assert hits.load_path({**HIT, "load_layerwise_small_steps": 1}) == "small"
    assert hits.load_path(HIT) == "whole"
    assert hits.load_path({"ms": 69.6}) == "-"
    line = hits.render(hits.rows(RESULTS, kvd_only=True)).splitlines()[1]
    assert " whole " in line


def test_cli_json_and_a_clear_error_for_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(RESULTS))
    script = str(ROOT / "benchmarks" / "gpu_e2e_hits.py")
    out = subprocess.run(
        [sys.executable, script, str(path), "--kvd", "--json"], capture_output=True, text=True
    )
    assert out.returncode == 0 and len(json.loads(out.stdout)) == 3
    bad = subprocess.run([sys.executable, script, str(tmp_path / "no.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr


def test_the_lane_script_uses_only_options_the_bench_has() -> None:
    """A renamed gpu-e2e option would fail only on the GPU machine, in a scarce lease."""
    from typer.main import get_command

    from infera.bench.cli import bench_app

    cmd = get_command(bench_app).commands["gpu-e2e"]  # type: ignore[attr-defined]
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    script = (ROOT / "benchmarks" / "gpu_lane_issue19.sh").read_text()
    used = {w for line in script.splitlines() if " e2e " in line for w in line.split() if w.startswith("--")}
    assert used, "no stage lines found"
    assert used <= known, f"options the bench does not have: {sorted(used - known)}"


def test_the_trace_table_splits_a_layer_wise_step(hits: Any) -> None:
    """Two traced steps in one hit are averaged; idle is the DMA window less the DMAs' own time,
    after is the forward left once the last DMA ended."""
    traced = {
        **HIT,
        "load_dma_us": 2 * 40_000,
        "load_lw_traced_steps": 2,
        "load_lw_cpu_first_wait_us": 2 * 3_000,
        "load_lw_cpu_us": 2 * 30_000,
        "load_lw_gpu_us": 2 * 55_000,
        "load_lw_dma_begin_us": 2 * 1_000,
        "load_lw_dma_end_us": 2 * 45_000,
    }
    results = {
        "records": [
            {"_kind": "RESULT", "model": "Llama", "role": "kvd-a", "tokens": 16384, "hit": [traced, HIT]}
        ]
    }
    table = hits.rows(results, kvd_only=True)
    text = hits.render_trace(table)
    lines = text.splitlines()
    assert len(lines) == 2, "the untraced hit has no line"
    cells = lines[1].split()
    assert cells[-6:] == ["3.0", "30.0", "55.0", "1.0..45.0", "4.0", "10.0"], lines[1]
    assert hits.render_trace(hits.rows(RESULTS, kvd_only=True)) == ""


def test_main_prints_the_trace_after_the_hits(hits: Any, tmp_path: Path, capsys: Any) -> None:
    traced = {**HIT, "load_lw_traced_steps": 1, "load_lw_gpu_us": 50_000, "load_lw_dma_end_us": 45_000}
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {"records": [{"_kind": "RESULT", "model": "M", "role": "kvd-a", "tokens": 8, "hit": [traced]}]}
        )
    )
    assert hits.main([str(path), "--kvd"]) == 0
    out = capsys.readouterr().out
    assert "layer-wise steps" in out and out.index("layer-wise steps") > out.index("busiest threads")
