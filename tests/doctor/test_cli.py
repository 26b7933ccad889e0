"""``kvd doctor`` as users run it: exit statuses, --json, selection, and a real run on this machine."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from hostkit import FIXTURES
from typer.testing import CliRunner

from infera.cli import app
from infera.doctor.registry import all_checks
from infera.doctor.render import render_text
from infera.doctor.run import run_doctor

KVD = Path(sys.executable).with_name("kvd")
runner = CliRunner()


def test_real_run_on_this_machine_is_one_json_object():
    proc = subprocess.run([str(KVD), "doctor", "--json"], capture_output=True, text=True, timeout=120)
    data = json.loads(proc.stdout)
    failed = [c["id"] for c in data["checks"] if c["status"] == "fail"]
    assert proc.returncode == (1 if failed else 0), proc.stderr
    # Other people's engines or daemons on a shared machine may fail the engine checks; nothing else may.
    assert set(failed) <= {"hash-settings", "chunk-tokens", "daemon"}
    assert set(data) >= {"checks", "summary"}
    ids = [c["id"] for c in data["checks"]]
    assert ids == [s.id for s in all_checks()]
    for c in data["checks"]:
        assert set(c) >= {"id", "title", "status", "summary", "evidence", "fix"}
        assert c["status"] in ("ok", "warn", "fail", "unknown", "skip")
        assert "kvd doctor bug" not in c["summary"]
        for e in c["evidence"]:
            assert e["source"], c["id"]
    assert sum(data["summary"].values()) == len(ids)
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["gpu"]["status"] == "skip" and "no AMD GPU" in by_id["gpu"]["summary"]
    assert by_id["amdgpu-loaded"]["status"] == "skip"
    assert proc.stderr == ""


def test_real_storage_check_probes_o_direct(short_tmp):
    res = runner.invoke(app, ["doctor", "--check", "storage", "--long-path", str(short_tmp), "--json"])
    data = json.loads(res.stdout)
    (st,) = data["checks"]
    probe = [e for e in st["evidence"] if e["source"].startswith("O_DIRECT probe")]
    assert probe and probe[0]["value"].split(":")[0] in ("yes", "no", "unverified")
    assert any(e["source"].startswith("block stack") for e in st["evidence"])
    assert not list(short_tmp.iterdir()), "the probe must remove its file"


def test_unknown_check_is_a_usage_error():
    res = runner.invoke(app, ["doctor", "--check", "no-such-check"])
    assert res.exit_code == 2
    assert "no doctor check named 'no-such-check'" in res.output


def test_root_that_is_not_a_directory_is_a_usage_error(tmp_path):
    res = runner.invoke(app, ["doctor", "--root", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "--root" in res.output


def test_a_root_with_nothing_readable_is_unknown_not_fine(tmp_path):
    """An empty (or wrong) --root gives no evidence either way: the checks that look for a
    container or for GPUs say they could not tell, never "not in a container" or "no GPU"."""
    checks = ["container", "kernel-p2pdma", "nvidia-gds", "cufile-config", "gpu"]
    res = runner.invoke(
        app, ["doctor", "--root", str(tmp_path), "--json", *(a for c in checks for a in ("-c", c))]
    )
    assert res.exit_code == 0, res.output
    status = {c["id"]: (c["status"], c["summary"]) for c in json.loads(res.stdout)["checks"]}
    assert {k: v[0] for k, v in status.items()} == dict.fromkeys(checks, "unknown"), status
    assert str(tmp_path) in status["container"][1]


def test_failed_check_exits_1_with_fix_lines():
    root = FIXTURES / "in-kernel-amdgpu" / "tree"
    res = runner.invoke(app, ["doctor", "--root", str(root), "-c", "kernel-p2pdma", "-c", "amdgpu-version"])
    assert res.exit_code == 1
    assert "fix: boot a kernel built with CONFIG_PCI_P2PDMA=y" in res.output
    assert "2 failed: kernel-p2pdma, amdgpu-version" in res.output


def test_json_of_a_fixture_host_and_area_selection():
    root = FIXTURES / "no-gpu" / "tree"
    res = runner.invoke(app, ["doctor", "--root", str(root), "--json", "--check", "platform"])
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert [c["id"] for c in data["checks"]] == ["container", "gpu", "kernel-p2pdma"]
    assert data["summary"] == {"ok": 0, "warn": 1, "fail": 0, "unknown": 0, "skip": 2}
    assert data["doctor"]["root"] == str(root.resolve())


def test_text_report_groups_by_area_and_verbose_shows_evidence():
    root = FIXTURES / "no-gpu" / "tree"
    plain = runner.invoke(app, ["doctor", "--root", str(root)]).output
    assert "Platform" in plain and "Storage" in plain and "[file]" not in plain
    assert "possibly inside a container" in plain
    verbose = runner.invoke(app, ["doctor", "--root", str(root), "--verbose"]).output
    assert "[file] /proc/config.gz: CONFIG_PCI_P2PDMA is not set" in verbose
    assert "docs/doctor/kernel-p2pdma.md" in verbose


def test_list_checks():
    res = runner.invoke(app, ["doctor", "--list-checks"])
    assert res.exit_code == 0
    assert [line.split()[0] for line in res.output.splitlines()] == [s.id for s in all_checks()]


def test_ascii_terminal_gets_ascii_symbols(hosts):
    rep = run_doctor(ctx=hosts.context("mi300x-sriov-vf"))
    out = render_text(rep, stream=io.TextIOWrapper(io.BytesIO(), encoding="ascii"), color=False, verbose=True)
    out.encode("ascii")
    assert "XX gpu" in out and "ok container" in out and "-- storage" in out
