"""`kvd bench ttft` argument handling (the benchmark itself needs vLLM and minutes of CPU)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from infera.bench.ttft import run_ttft_bench
from infera.cli import app
from infera.errors import UsageError


@pytest.mark.parametrize("sizes", ["abc", "", "128"])
def test_bad_sizes_are_usage_errors(sizes: str) -> None:
    with pytest.raises(UsageError):
        run_ttft_bench(python=sys.executable, sizes=sizes)


def test_python_without_vllm_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["bench", "ttft", "--python", "/bin/false", "--sizes", "1024"])
    assert result.exit_code == 2
    assert "cannot import vllm" in result.output
