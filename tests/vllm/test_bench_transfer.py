"""``kvd bench transfer --device cpu``: the GPU benchmark's code paths as a dry run on CPU tensors.

The figures of a CPU run mean nothing; what this checks is that the command runs the worker's real
save and load against a real daemon, verifies every byte it moved, keeps stdout for the JSON
object (vLLM's logger writes to stdout unless told otherwise), and reports the unregistered row as
a fallback.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_transfer_dry_run_verifies_its_rows_and_reports_the_fallback_row() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "infera.cli", "bench", "transfer", "--device", "cpu", "--models", "8b",
         "--dtypes", "bf16", "--layouts", "0.26,0.29", "--chunk-mib", "2", "--tokens", "64",
         "--repeat", "1", "--kernels", "auto,torch", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    assert {(r["layout"], r["registered"]) for r in rows} == {("0.26", True), ("0.29", True), ("0.26", False)}
    assert all(r["verified"] for r in rows)
    assert all(r["kernel"] == "torch" for r in rows), "no Triton kernel for KV on the CPU"
    unpinned = [r for r in rows if not r["registered"]]
    assert unpinned[0]["fallback"] and "INFERA_KVD_REGISTER=0" in unpinned[0]["fallback_reason"]
    assert all(r["data_path"] == "arena-unpinned" for r in rows)  # no GPU: nothing is registered
