"""``kvd bench`` argument errors: one line, exit status 2, before anything starts.

The table runs each command in-process through Typer's CliRunner with ``subprocess.Popen``
replaced by a tripwire, with the working directory and ``$TMPDIR`` in an empty directory: a bad
flag must be refused before a daemon, a store or an engine starts, and before a work or results
directory is made. Then the errors a check cannot refuse up front: every gpu-e2e engine failing,
and torch missing for ``bench transfer``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infera.cli import app

NO_E2E_MODELS = ["--no-check", "--gemma3-sizes", ""]  # gpu-e2e with no torch-built models


def _no_process(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"the benchmark started a process before checking its arguments: {args[:1]}")


def _only_error_lines(output: str) -> list[str]:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert lines and all(ln.startswith(("error: ", "hint: ")) for ln in lines), output
    assert sum(ln.startswith("error: ") for ln in lines) == 1, output
    return lines


CASES = [
    (["arena", "--chunk-size", "0"], "--chunk-size must be at least 1"),
    (["arena", "--json", "--chunk-size", "0"], "--chunk-size must be at least 1"),
    (["arena", "--rounds", "0"], "--rounds must be at least 1"),
    (["arena", "--rounds", "-5"], "--rounds must be at least 1"),
    (["arena", "--index-chunks", "-1"], "--index-chunks must be at least 1"),
    (["disk", "--files", "-5", "--chunks", "1"], "--files must be at least 0"),
    (["disk", "--chunks", "0"], "--chunks must be at least 1"),
    (["disk", "--chunk-size", "0"], "--chunk-size must be at least 1"),
    (["disk", "--fsync", "bogus"], "--fsync: 'bogus' is not one of none, data, always"),
    (["l4", "--rounds", "-1"], "--rounds must be at least 1"),
    (["l4", "--batch", "0"], "--batch must be at least 1"),
    (["l4", "--count", "0"], "--count must be at least 1"),
    (["top-render", "--frames", "0"], "--frames must be at least 1"),
    (["top-render", "--clients", "-1"], "--clients must be at least 0"),
    (["ttft", "--python", "/nonexistent/python"], "--python: /nonexistent/python does not exist"),
    (["ttft", "--repeat", "0"], "--repeat must be at least 1"),
    (["ttft", "--hidden", "8"], "--hidden must be at least 64"),
    (
        ["compare", "--vllm-python", "/nonexistent", "--only", "ttft"],
        "--vllm-python: /nonexistent does not exist",
    ),
    (["compare", "--threads", "0", "--only", "store"], "--threads must be at least 1"),
    (["transfer", "--tokens", "0", "--device", "cpu"], "--tokens must be at least 1"),
    (["transfer", "--repeat", "0", "--device", "cpu"], "--repeat must be at least 1"),
    (["transfer", "--chunk-mib", "0", "--device", "cpu"], "--chunk-mib takes sizes in MiB above 0"),
    (["transfer", "--device", "gpu"], "--device: 'gpu' is not one of cuda, cpu"),
    (["gpu-e2e", "--python", "/nonexistent", *NO_E2E_MODELS], "--python: /nonexistent does not exist"),
    (["gpu-e2e", "--repeat", "0", *NO_E2E_MODELS], "--repeat must be at least 1"),
    (["gpu-e2e", "--timeout", "0", *NO_E2E_MODELS], "--timeout must be at least 1"),
    (["gpu-e2e", "--native-cpu-gb", "0", *NO_E2E_MODELS], "--native-cpu-gb must be above 0"),
    (["scale", "--only", "bogus"], "--only: bogus is not one of index, restart"),
    (["scale", "--restart-files", "abc"], "--restart-files: 'abc' is not a list of counts"),
]


@pytest.mark.parametrize(("args", "says"), CASES, ids=[" ".join(args) for args, _ in CASES])
def test_bad_arguments_are_one_line_usage_errors_before_anything_starts(
    args: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(subprocess, "Popen", _no_process)
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert _only_error_lines(result.output)[0].startswith(f"error: {says}"), result.output
    assert not list(tmp_path.iterdir()), "nothing is made before the arguments are checked"


def test_a_bad_disk_tier_environment_variable_is_refused_before_the_disk_bench_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("INFERA_KVD_DISK_READERS", "abc")
    monkeypatch.setattr(subprocess, "Popen", _no_process)
    result = CliRunner().invoke(app, ["bench", "disk", "--chunks", "1"])
    assert result.exit_code == 2, result.output
    assert _only_error_lines(result.output)[0].startswith("error: INFERA_KVD_DISK_READERS: 'abc' is not")
    assert not list(tmp_path.iterdir())


def test_gpu_e2e_without_vllm_is_refused_up_front_as_ttft_is(tmp_path: Path) -> None:
    # in a subprocess: this test process finds tests/vllm as a namespace package named vllm
    find = "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([sys.executable, "-c", find], cwd=tmp_path).returncode == 0:
        pytest.skip("vLLM is installed here")
    for command in (["gpu-e2e", *NO_E2E_MODELS, "--repeat", "1"], ["ttft", "--sizes", "1024"]):
        argv = [sys.executable, "-m", "infera.cli", "bench", *command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert _only_error_lines(proc.stderr)[0] == "error: vLLM is not installed in this Python"
    assert not list(tmp_path.iterdir()), "no work directory, no daemon"


def test_gpu_e2e_where_every_engine_fails_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    """A Python whose ``vllm`` passes the up-front check but cannot start an engine: each engine
    reports its error, and the run ends with one line naming the first, not an empty table."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text('raise ImportError("a stand-in vllm with no engine")\n')
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={fake}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "infera.cli", "bench", "gpu-e2e", "--python", str(python), "--small"]
    argv += [*NO_E2E_MODELS, "--sizes", "512", "--partial", "", "--repeat", "1", "--json", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout == "", "no results: no JSON object"
    last = proc.stderr.strip().splitlines()[-2:]
    assert last[0].startswith("error: every engine failed"), proc.stderr[-2000:]
    assert "ImportError: a stand-in vllm with no engine" in last[0]
    assert last[1] == f"hint: the engine logs are in {out}"
    assert "Traceback" not in proc.stderr
    records = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    assert {r["role"] for r in records if r["_kind"] == "ERROR"} == {"native", "kvd-a", "kvd-b"}
    assert not any(r["_kind"] == "INFO" and "restart" in r for r in records), "no daemon restart"


def test_transfer_without_torch_says_so_and_which_venv_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees where it is missing
    monkeypatch.setattr(subprocess, "Popen", _no_process)
    result = CliRunner().invoke(app, ["bench", "transfer", "--device", "cpu"])
    assert result.exit_code == 1, result.output
    error, hint = _only_error_lines(result.output)
    assert error.startswith("error: kvd bench transfer needs torch, which is not installed"), error
    assert "GPU" not in error
    assert ".venv-vllm026/bin/python -m infera.cli bench transfer" in hint


def test_disk_with_a_tiny_total_does_not_trip_the_daemons_long_tier_minimum(tmp_path: Path) -> None:
    """The bench picks ``--long-bytes`` itself: never below the daemon's 1M minimum."""
    argv = [sys.executable, "-m", "infera.cli", "bench", "disk", "--path", str(tmp_path)]
    argv += ["--chunks", "1", "--chunk-size", "4K", "--files", "0", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert res["chunks"] == 1 and res["chunk_bytes"] == 4096 and res["write_ratio"] > 0


@pytest.mark.parametrize("command", ["arena", "disk", "l4", "top-render", "transfer", "gpu-e2e"])
def test_help_shows_the_defaults(command: str) -> None:
    result = CliRunner().invoke(app, ["bench", command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "[default: " in result.output, result.output
    if command == "arena":
        assert "[default: 4M]" in result.output and "[default: 200]" in result.output
