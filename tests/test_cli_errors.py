"""Every ``kvd`` command's option errors, as the CLI framework finds them (a value of the wrong
type, an unknown option, a missing value), are one ``error:`` line and a ``hint:``, exit 2: the
root group turns them into our UsageError (``infera.clikit.OneLineGroup``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (["bench", "arena", "--rounds", "abc"], "error: --rounds: 'abc' is not a whole number"),
        (["stat", "--watch", "abc"], "error: --watch: 'abc' is not a number"),
        (["top", "--interval", "x"], "error: --interval: 'x' is not a number"),
        (["doctor", "--no-such-flag"], "error: no such option: --no-such-flag"),
        (["serve", "--max-bytes"], "error: option '--max-bytes' requires an argument"),
        (["launch", "single", "--model", "m", "--port", "abc"], "error: --port: 'abc' is not a whole number"),
        (["no-such-command"], "error: no such command 'no-such-command'"),
    ],
)
def test_framework_usage_errors_are_one_line(args: list[str], first: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "infera.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[0] == first, proc.stderr
    assert len(lines) <= 2 and all(ln.startswith(("error: ", "hint: ")) for ln in lines), proc.stderr
    assert proc.stdout == ""
