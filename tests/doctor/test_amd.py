"""amdgpu version judgement where the module string is ambiguous, and DKMS read both ways."""

from __future__ import annotations

import os
import shutil

from infera.doctor.context import Context, DoctorOptions
from infera.doctor.facts.amd import dkms_info, installed_driver
from infera.doctor.host import HostView
from infera.doctor.runner import CommandRunner


def _version(hosts, tree, **kw):
    return (
        hosts.run("mi300x-healthy", tree=tree, checks=["amdgpu-version"], **kw).get("amdgpu-version").result
    )


def test_four_field_module_version_names_the_driver(hosts):
    tree = hosts.copy("mi300x-healthy")
    (tree / "sys/module/amdgpu/version").write_text("6.19.14.31400000\n")
    r = _version(hosts, tree)
    assert r.status.value == "ok" and "driver 31.40.0" in r.summary


def test_6_16_6_from_30_20_0_fails_on_its_build(hosts):
    tree = hosts.copy("mi300x-healthy")
    dk = tree / "var/lib/dkms/amdgpu"
    (dk / "6.16.6-2255209.24.04").rename(dk / "6.16.6-2238411.24.04")
    r = _version(hosts, tree)
    assert r.status.value == "fail" and "2238411" in r.summary and "30.20.0" in r.summary


def test_6_16_6_without_a_readable_build_is_unknown(hosts):
    tree = hosts.copy("mi300x-healthy")
    shutil.rmtree(tree / "var/lib/dkms")
    (tree / "var/lib/dpkg/status").unlink()
    r = _version(hosts, tree)
    assert r.status.value == "unknown" and "30.20.0 and 30.20.1" in r.summary


def test_package_version_decides_when_dkms_tree_is_gone(hosts):
    tree = hosts.copy("mi300x-healthy")
    shutil.rmtree(tree / "var/lib/dkms")
    r = _version(hosts, tree)
    assert r.status.value == "ok" and "package amdgpu-dkms 1:6.16.6.30200100-2255209.24.04" in r.summary


def _live(fp, tmp_path, *commands):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for argv, out in commands:
        (bindir / argv[0]).write_text("#!/bin/sh\nexit 99\n")
        (bindir / argv[0]).chmod(0o755)
        fp.register([fp.program(argv[0]), *argv[1:]], stdout=out)
    host = HostView("/")
    return Context(
        DoctorOptions(), host=host, runner=CommandRunner(host, path=str(bindir)), processes=lambda: []
    )


def test_dkms_status_command_on_a_live_host(fp, tmp_path):
    ctx = _live(
        fp,
        tmp_path,
        (
            ["dkms", "status", "amdgpu"],
            "amdgpu/6.16.13-2341068.24.04, 6.8.0-101-generic, x86_64: installed\n",
        ),
    )
    info = dkms_info(ctx)
    assert [(e.version, e.build) for e in info.entries] == [("6.16.13-2341068.24.04", 2341068)]
    assert info.for_kernel("6.8.0-101-generic").build == 2341068
    assert info.evidence[0].source == "dkms status amdgpu"


def test_modinfo_on_a_live_host_has_no_basedir(fp, tmp_path):
    rel = os.uname().release
    ctx = _live(
        fp,
        tmp_path,
        (["modinfo", "-k", rel, "-F", "version", "amdgpu"], "6.16.6\n"),
        (["modinfo", "-k", rel, "-F", "srcversion", "amdgpu"], "ABC\n"),
        (
            ["modinfo", "-k", rel, "-F", "filename", "amdgpu"],
            f"/lib/modules/{rel}/updates/dkms/amdgpu.ko.zst\n",
        ),
    )
    inst = installed_driver(ctx)
    assert inst.version and inst.version.raw == "6.16.6" and inst.srcversion == "ABC" and inst.is_dkms


def test_modinfo_error_is_reported_not_raised(fp, tmp_path):
    rel = os.uname().release
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "modinfo").write_text("#!/bin/sh\n")
    (bindir / "modinfo").chmod(0o755)
    fp.register(
        [fp.program("modinfo"), fp.any()], stderr="modinfo: ERROR: Module amdgpu not found.\n", returncode=1
    )
    host = HostView("/")
    ctx = Context(
        DoctorOptions(), host=host, runner=CommandRunner(host, path=str(bindir)), processes=lambda: []
    )
    inst = installed_driver(ctx)
    assert inst.error == "modinfo: ERROR: Module amdgpu not found." and rel
