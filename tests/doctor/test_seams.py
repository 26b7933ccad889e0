"""The seams every check goes through: host view, command runner, registry, crash containment."""

from __future__ import annotations

import gzip
import os
import sys

import pytest

from infera.doctor import registry
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.host import HostView
from infera.doctor.model import CheckResult, Status, ok
from infera.doctor.run import run_doctor
from infera.doctor.runner import CommandRunner
from infera.errors import UsageError


def test_runner_runs_real_commands_and_keeps_exit_status(tmp_path):
    r = CommandRunner(HostView("/"))
    res = r.run(["sh", "-c", "echo out; echo err >&2; echo $LC_ALL; exit 3"])
    assert res.ran and not res.ok
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\nC\n", "err\n")
    assert r.run(["sh", "-c", "echo out; echo err >&2; echo $LC_ALL; exit 3"]) is res


def test_runner_reports_missing_and_timeouts():
    r = CommandRunner(HostView("/"))
    missing = r.run(["kvd-doctor-no-such-program", "--x"])
    assert missing.missing and missing.returncode is None
    slow = r.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3)
    assert slow.error and "timed out" in slow.error


def test_runner_prefers_the_copy_under_the_root(tmp_path):
    tool = tmp_path / "opt/rocm/bin/ais-check"
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\necho from-root "$@"\n')
    tool.chmod(0o755)
    r = CommandRunner(HostView(tmp_path), path=str(tmp_path / "empty"))
    res = r.run(["ais-check", "-v"], also=["/opt/rocm/bin/ais-check"])
    assert res.ok and res.stdout == "from-root -v\n"
    assert res.line == "/opt/rocm/bin/ais-check -v"
    tool.chmod(0o644)
    r2 = CommandRunner(HostView(tmp_path), path=str(tmp_path / "empty"))
    assert r2.run(["ais-check"], also=["/opt/rocm/bin/ais-check"]).missing


def test_host_view_reads_under_the_root_only(tmp_path):
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    (tmp_path / "sys/module/amdgpu/version").write_text("6.16.6\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_PCI_P2PDMA=y\n"))
    h = HostView(tmp_path)
    assert not h.live
    assert h.value("/sys/module/amdgpu/version") == "6.16.6"
    assert h.read("/sys/module/nvidia_fs/version").error == "missing"
    assert h.read("/sys/module").error == "is a directory"
    assert h.read("/proc/config.gz", gz=True).text == "CONFIG_PCI_P2PDMA=y\n"
    assert h.read("/sys/module/amdgpu/version", gz=True).error


def test_host_view_resolves_links_inside_the_root(tmp_path):
    (tmp_path / "sys/devices/virtual/block/md0").mkdir(parents=True)
    (tmp_path / "sys/dev/block").mkdir(parents=True)
    os.symlink("../../devices/virtual/block/md0", tmp_path / "sys/dev/block/9:0")
    os.symlink("/sys/devices/virtual/block/md0", tmp_path / "sys/abs")
    os.symlink("loop", tmp_path / "loop")
    h = HostView(tmp_path)
    assert h.resolve("/sys/dev/block/9:0") == "/sys/devices/virtual/block/md0"
    assert h.resolve("/sys/abs/md/level") == "/sys/devices/virtual/block/md0/md/level"
    with pytest.raises(OSError):
        h.resolve("/loop")


def test_select_by_id_and_area_and_unknown_name():
    assert [s.id for s in registry.select(["storage"])] == ["storage"]
    assert {s.id for s in registry.select(["engines"])} == {
        "hash-settings",
        "chunk-tokens",
        "isolation",
        "kv-groups",
    }
    with pytest.raises(UsageError) as exc:
        registry.select(["no-such-check"])
    assert exc.value.exit_code == 2 and "dmesg-ais" in (exc.value.hint or "")


def test_adding_a_check_is_one_decorated_function(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @registry.check("etcd-workers", "P/D worker registrations", "daemon", order=90)
    def etcd_workers(ctx: Context) -> CheckResult:
        return ok(f"asked {ctx.options.extra.get('etcd')}")

    opts = DoctorOptions(root="/", checks=["etcd-workers"], extra={"etcd": "127.0.0.1:2379"})
    rep = run_doctor(ctx=Context(opts, processes=lambda: []))
    assert [(r.id, r.result.summary) for r in rep.results] == [("etcd-workers", "asked 127.0.0.1:2379")]


def test_a_check_that_raises_becomes_unknown_not_a_crash(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @registry.check("explodes", "always raises", "platform")
    def explodes(ctx: Context) -> CheckResult:
        raise RuntimeError("boom")

    rep = run_doctor(ctx=Context(DoctorOptions(checks=["explodes", "container"]), processes=lambda: []))
    bad = rep.get("explodes").result
    assert bad.status is Status.UNKNOWN and "boom" in bad.summary and bad.fix
    assert rep.get("container").result.status in (Status.OK, Status.WARN)
    assert rep.exit_code == 0


def test_kallsyms_module_symbols_past_eight_mib_are_found(tmp_path):
    from infera.doctor.facts.kernel import AIS_SYMBOL, kallsyms

    (tmp_path / "proc").mkdir()
    filler = "ffffffff81000000 T some_kernel_function_with_a_long_name\n" * (9 * 1024 * 1024 // 56)
    (tmp_path / "proc/kallsyms").write_text(filler + f"ffffffffc1c9b120 t {AIS_SYMBOL}\t[amdgpu]\n")
    ctx = Context(DoctorOptions(root=str(tmp_path)))
    assert AIS_SYMBOL in kallsyms(ctx).found
