"""The emitted shell really runs: bash executes it with `python` replaced by a stub.

The stub hands `python -m infera.kvd` to the real interpreter (a real daemon starts on a temporary
socket) and records each engine's argv and environment, and whether the daemon answered a PING on
INFERA_KVD_SOCKET when the engine started. The records must equal the deployment `--format json` prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launchkit import kvd, local_args, run_script, wait_gone


def _deployment(tmp: Path, kind: str, *extra: str) -> tuple[str, dict]:  # type: ignore[type-arg]
    sock = str(tmp / "kvd.sock")
    extra = ("--python", "python", *extra)  # the stub is the `python` first on PATH
    args = [*local_args(kind, sock), *extra]
    script = kvd("launch", *args).stdout
    spec = json.loads(kvd("launch", *args, "--json").stdout)
    return script, spec


def _check(record: dict, leg: dict) -> None:  # type: ignore[type-arg]
    assert record["argv"] == leg["argv"]
    for key, value in leg["env"].items():
        assert record["env"].get(key) == value, key
    for key in (
        "INFERA_KVD_SOCKET",
        "INFERA_KVD_AIS",
        "INFERA_KVD_HIPFILE_ROOTS",
        "PYTHONHASHSEED",
        "VLLM_HOST_IP",
    ):
        if key not in leg["env"]:
            assert key not in record["env"], key
    ktc = record["argv"][record["argv"].index("--kv-transfer-config") + 1]
    assert json.loads(ktc) == leg["kv_transfer_config"]


def test_single_script_starts_the_daemon_then_the_engine(short_tmp: Path) -> None:
    script, spec = _deployment(short_tmp, "single", "--prewarm")
    code, records, out = run_script(script, short_tmp)
    assert code == 0, out
    assert len(records) == 1
    _check(records[0], spec["legs"][0])
    assert records[0]["daemon_answered"] is True, records[0]["daemon_answered"]
    assert wait_gone(short_tmp / "kvd.sock"), "the daemon was not stopped when the engine ended"


@pytest.mark.parametrize("part", ["all", "prefill", "decode", "router"])
def test_pd_script_parts(short_tmp: Path, part: str) -> None:
    script, spec = _deployment(short_tmp, "pd")
    args = [] if part == "all" else [part]
    code, records, out = run_script(script, short_tmp, *args)
    assert code == 0, out
    legs = {leg["name"]: leg for leg in spec["legs"]}
    routers = [r for r in records if "vllm_router.launch_router" in r["argv"]]
    assert [r["argv"] for r in routers] == ([spec["routers"][0]["argv"]] if part in ("all", "router") else [])
    records = [r for r in records if r not in routers]
    want = {"all": ["prefill", "decode"], "router": []}.get(part, [part])
    assert len(records) == len(want)
    by_port = {r["argv"][r["argv"].index("--port") + 1]: r for r in records}
    for name in want:
        leg = legs[name]
        rec = by_port[leg["argv"][leg["argv"].index("--port") + 1]]
        _check(rec, leg)
        assert rec.get("daemon_answered") is (True if name == "prefill" else None)
    assert part == "router" or wait_gone(short_tmp / "kvd.sock")
    if part in ("decode", "router"):
        assert "infera.kvd" not in out  # no daemon on the decode host


def test_unknown_part_is_a_usage_error(short_tmp: Path) -> None:
    script, _ = _deployment(short_tmp, "single")
    code, records, out = run_script(script, short_tmp, "bogus")
    assert code == 2 and records == [] and "usage:" in out


def test_script_fails_when_the_daemon_cannot_start(short_tmp: Path) -> None:
    script, _ = _deployment(short_tmp, "single")
    script = script.replace("--max-bytes 64M", "--max-bytes 1K")  # below the daemon's minimum
    code, records, out = run_script(script, short_tmp)
    assert code != 0 and records == []
    assert "the kvd daemon exited" in out


def test_emitted_script_passes_bash_syntax_check(short_tmp: Path) -> None:
    import subprocess

    for kind in ("single", "pd"):
        script, _ = _deployment(short_tmp, kind)
        (short_tmp / "s.sh").write_text(script)
        assert subprocess.run(["bash", "-n", str(short_tmp / "s.sh")]).returncode == 0


def test_launch_run_executes_the_shell(short_tmp: Path) -> None:
    import subprocess
    import sys

    from launchkit import make_stub

    env = make_stub(short_tmp)
    sock = str(short_tmp / "kvd.sock")
    cmd = [
        sys.executable,
        "-m",
        "infera.cli",
        "launch",
        "single",
        "--model",
        "m",
        "--socket",
        sock,
        "--max-bytes",
        "64M",
        "--python",
        "python",  # the stub first on PATH
        "--run",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(p.read_text()) for p in (short_tmp / "records").glob("*.json")]
    assert len(records) == 1 and records[0]["daemon_answered"] is True
    assert wait_gone(short_tmp / "kvd.sock")
