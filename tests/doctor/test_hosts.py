"""Every check on every fixture host: the status each must reach, and the words that matter."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from hostkit import FIXTURES, HOSTS, statuses

AMD_SKIP = dict.fromkeys(
    ("amdgpu-loaded", "amdgpu-version", "ais-check", "dmesg-ais", "kfd-capability", "rocm", "gpu"), "skip"
)
NO_ENGINES = {
    "hash-settings": "skip",
    "chunk-tokens": "skip",
    "kv-groups": "skip",
    "daemon": "skip",
    "pd-workers": "skip",
}
#: The memory, leftovers and isolation checks on the GPU fixture hosts, which hold no cgroup,
#: meminfo or /dev/shm files (so those say unknown) and no kvd sockets.
KVD_DEFAULTS = {
    "cgroup-memory": "unknown",
    "dev-shm": "unknown",
    "memlock": "skip",
    "hugepages": "unknown",
    "disk-namespaces": "skip",
    "isolation": "skip",
    "leftovers": "ok",
    "arena-sharing": "ok",
    "cufile-config": "skip",
}
WITH_LONG_PATH = {**KVD_DEFAULTS, "disk-namespaces": "ok"}

#: A healthy MI300X host with a long (disk) path; the other AMD hosts say where they differ from it.
MI300X_HEALTHY = {
    "container": "ok",
    "gpu": "ok",
    "kernel-p2pdma": "ok",
    "amdgpu-loaded": "ok",
    "amdgpu-version": "ok",
    "ais-check": "ok",
    "dmesg-ais": "ok",
    "kfd-capability": "ok",
    "rocm": "ok",
    "storage": "ok",
    "nvidia-gds": "skip",
    **NO_ENGINES,
    **WITH_LONG_PATH,
}

EXPECTED: dict[str, dict[str, str]] = {
    "mi300x-healthy": MI300X_HEALTHY,
    "mi300x-reboot-needed": {
        **MI300X_HEALTHY,
        "amdgpu-loaded": "fail",
        "amdgpu-version": "fail",
        "ais-check": "fail",
        "dmesg-ais": "fail",
    },
    "mi300x-container": {
        **MI300X_HEALTHY,
        "container": "warn",
        "amdgpu-loaded": "unknown",
        "dmesg-ais": "unknown",
        "dev-shm": "ok",
    },
    "in-kernel-amdgpu": {
        **MI300X_HEALTHY,
        **KVD_DEFAULTS,
        "kernel-p2pdma": "fail",
        "amdgpu-version": "fail",
        "ais-check": "fail",
        "dmesg-ais": "fail",
        "rocm": "warn",
        "storage": "skip",
    },
    "md-raid0": {**MI300X_HEALTHY, "storage": "warn"},
    "mi300x-sriov-vf": {
        **MI300X_HEALTHY,
        **KVD_DEFAULTS,
        "gpu": "fail",
        "ais-check": "warn",
        "dmesg-ais": "fail",
        "storage": "skip",
    },
    "nvidia-h100": {
        "container": "ok",
        "kernel-p2pdma": "ok",
        "storage": "skip",
        "nvidia-gds": "ok",
        **AMD_SKIP,
        **NO_ENGINES,
        **KVD_DEFAULTS,
    },
    "no-gpu": {
        "container": "warn",
        "kernel-p2pdma": "skip",
        "storage": "skip",
        "nvidia-gds": "skip",
        **AMD_SKIP,
        **NO_ENGINES,
        **KVD_DEFAULTS,
    },
    "kvd-container-ok": {
        "container": "warn",
        "kernel-p2pdma": "skip",
        "storage": "unknown",
        "nvidia-gds": "skip",
        **AMD_SKIP,
        **NO_ENGINES,
        **WITH_LONG_PATH,
        "cgroup-memory": "ok",
        "dev-shm": "ok",
        "memlock": "ok",
        "hugepages": "ok",
    },
    "kvd-container-bad": {
        "container": "warn",
        "kernel-p2pdma": "skip",
        "storage": "unknown",
        "nvidia-gds": "skip",
        **AMD_SKIP,
        **NO_ENGINES,
        **KVD_DEFAULTS,
        "cgroup-memory": "fail",
        "dev-shm": "warn",
        "memlock": "fail",
        "hugepages": "fail",
        "disk-namespaces": "warn",
        "leftovers": "fail",
        "arena-sharing": "warn",
    },
    "nvidia-no-nvfs": {
        "container": "ok",
        "kernel-p2pdma": "ok",
        "storage": "skip",
        "nvidia-gds": "warn",
        **AMD_SKIP,
        **NO_ENGINES,
        **KVD_DEFAULTS,
    },
}
LONG_PATH = {
    "mi300x-healthy": "/nvme/kvd-long",
    "mi300x-reboot-needed": "/nvme/kvd-long",
    "mi300x-container": "/nvme/kvd-long",
    "md-raid0": "/nvme/kvd-long",
    "kvd-container-ok": "/nvme/kvd-long",
    "kvd-container-bad": "/nvme/kvd-long",
}


def test_every_fixture_host_has_expectations():
    assert sorted(EXPECTED) == HOSTS


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_host_statuses(hosts, name):
    report = hosts.run(name, long_path=LONG_PATH.get(name))
    assert statuses(report) == EXPECTED[name]
    assert report.exit_code == (1 if "fail" in EXPECTED[name].values() else 0)
    for r in report.results:
        assert "kvd doctor bug" not in r.result.summary, r.result.summary
        if r.result.status.value in ("warn", "fail"):
            assert r.result.fix, f"{r.id} has a {r.result.status} without a fix line"
        if r.result.status.value == "unknown":
            assert "(" in r.result.summary or ":" in r.result.summary, "unknown must say why"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_never_suggests_mounting_boot_into_a_container(hosts, name):
    text = json.dumps(hosts.run(name, long_path=LONG_PATH.get(name)).to_json())
    assert not re.search(r"-v /boot|--volume[ =]/boot", text)
    for m in re.finditer(r"mount(?:ing)? /boot", text):
        assert text[max(0, m.start() - 12) : m.start()].rstrip().endswith(("not", "never")), text[
            m.start() - 40 : m.end()
        ]


def test_reboot_needed_names_both_versions(hosts):
    r = hosts.run("mi300x-reboot-needed", checks=["amdgpu-loaded"]).get("amdgpu-loaded").result
    assert "reboot needed" in r.summary
    assert "6.14.14" in r.summary and "6.16.6" in r.summary
    assert "reboot" in (r.fix or "")
    sources = " ".join(e.source for e in r.evidence)
    assert "/sys/module/amdgpu/version" in sources and "modinfo" in sources


def test_same_version_different_build_needs_reboot(hosts):
    tree = hosts.copy("mi300x-healthy")
    (tree / "sys/module/amdgpu/srcversion").write_text("0123456789ABCDEF0123456\n")
    r = hosts.run("mi300x-healthy", tree=tree, checks=["amdgpu-loaded"]).get("amdgpu-loaded").result
    assert r.status.value == "fail"
    assert "different builds" in r.summary and "0123456789ABCDEF0123456" in r.summary


def test_in_kernel_driver_is_recognised(hosts):
    rep = hosts.run("in-kernel-amdgpu", checks=["amdgpu-loaded", "amdgpu-version"])
    assert "in-kernel" in rep.get("amdgpu-loaded").result.summary
    assert "in-kernel" in rep.get("amdgpu-version").result.summary


def test_in_kernel_running_while_dkms_installed_fails(hosts):
    ctx_cmds = [
        {
            "argv": ["modinfo", "-b", "{root}", "-k", "5.15.0-119-generic", "-F", "version", "amdgpu"],
            "stdout": "6.16.6\n",
        },
        {
            "argv": ["modinfo", "-b", "{root}", "-k", "5.15.0-119-generic", "-F", "srcversion", "amdgpu"],
            "stdout": "AB\n",
        },
        {
            "argv": ["modinfo", "-b", "{root}", "-k", "5.15.0-119-generic", "-F", "filename", "amdgpu"],
            "stdout": "/lib/modules/5.15.0-119-generic/updates/dkms/amdgpu.ko.zst\n",
        },
    ]
    r = hosts.run("in-kernel-amdgpu", commands=ctx_cmds, checks=["amdgpu-loaded"]).get("amdgpu-loaded").result
    assert r.status.value == "fail" and "reboot needed" in r.summary and "in-kernel" in r.summary


def test_container_reports_ais_check_p2pdma_line_untrusted(hosts):
    rep = hosts.run("mi300x-container", checks=["ais-check", "dmesg-ais", "amdgpu-loaded", "container"])
    ais = rep.get("ais-check").result
    assert "amdgpu : True" in ais.summary
    assert "not trustworthy in a container" in ais.summary
    dm = rep.get("dmesg-ais").result
    assert "Operation not permitted" in dm.summary
    loaded = rep.get("amdgpu-loaded").result
    assert "6.19.4" in loaded.summary and "container" in loaded.summary
    cont = rep.get("container").result
    assert "private cgroup namespace" in cont.summary
    assert any(e.source.endswith("/.dockerenv") or "/.dockerenv" in e.source for e in cont.evidence)


def test_md_raid0_is_a_warn_with_a_forced_fastpath_read(hosts):
    r = hosts.run("md-raid0", long_path="/nvme/kvd-long", checks=["storage"]).get("storage").result
    assert r.status.value == "warn"
    assert "md raid0 of 4" in r.summary
    assert "HIPFILE_ALLOW_COMPAT_MODE=false" in (r.fix or "")
    assert any("block stack (sysfs)" in e.source for e in r.evidence)


def test_md_raid5_says_it_always_falls_back(hosts):
    tree = hosts.copy("md-raid0")
    (tree / "sys/devices/virtual/block/md0/md/level").write_text("raid5\n")
    r = hosts.run("md-raid0", tree=tree, long_path="/nvme/kvd-long", checks=["storage"]).get("storage").result
    assert r.status.value == "warn" and "always falls back" in r.summary


def test_sriov_vf_names_the_virtual_function(hosts):
    rep = hosts.run("mi300x-sriov-vf", checks=["gpu", "dmesg-ais", "container"])
    assert "virtual function" in rep.get("gpu").result.summary
    assert "SR-IOV VFs" in rep.get("dmesg-ais").result.summary
    assert any("virtual machine" in d for d in rep.get("container").result.details)


def test_vf_seen_from_the_host_side_by_physfn_link(hosts):
    import os

    tree = hosts.copy("mi300x-healthy")
    vf = tree / "sys/bus/pci/devices/0000:05:02.0"
    vf.mkdir()
    for f in ("vendor", "class", "resource", "mem_info_vram_total", "mem_info_vis_vram_total"):
        (vf / f).write_text((tree / "sys/bus/pci/devices/0000:05:00.0" / f).read_text())
    (vf / "device").write_text("0x74a1\n")
    os.symlink("../0000:05:00.0", vf / "physfn")
    os.symlink("../../../../bus/pci/drivers/amdgpu", vf / "driver")
    r = hosts.run("mi300x-healthy", tree=tree, checks=["gpu"]).get("gpu").result
    assert r.status.value == "fail" and "0000:05:02.0" in r.summary and "physfn" in r.summary


def test_small_bar_fails(hosts):
    tree = hosts.copy("mi300x-healthy")
    (tree / "sys/bus/pci/devices/0000:26:00.0/mem_info_vis_vram_total").write_text("268435456\n")
    r = hosts.run("mi300x-healthy", tree=tree, checks=["gpu"]).get("gpu").result
    assert r.status.value == "fail" and "small BAR" in r.summary and "0000:26:00.0" in r.summary


def test_dmesg_missing_one_gpu_names_it(hosts):
    cmds = [
        {
            "argv": ["dmesg"],
            "stdout": "[   11.2] amdgpu 0000:05:00.0: amdgpu: AIS: registered 196608MB device memory\n",
        }
    ]
    r = hosts.run("mi300x-healthy", commands=cmds, checks=["dmesg-ais"]).get("dmesg-ais").result
    assert r.status.value == "fail" and "1 of 2" in r.summary and "0000:26:00.0" in r.summary


def test_dmesg_wrapped_ring_buffer_is_unknown_not_fail(hosts):
    cmds = [{"argv": ["dmesg"], "stdout": "[86400.123456] eth0: link up\n[86401.000001] nothing about AIS\n"}]
    r = hosts.run("mi300x-healthy", commands=cmds, checks=["dmesg-ais"]).get("dmesg-ais").result
    assert r.status.value == "unknown" and "no longer reaches back to boot" in r.summary


def test_nvidia_reports_counters_and_verification(hosts):
    r = hosts.run("nvidia-h100", checks=["nvidia-gds"]).get("nvidia-gds").result
    assert "nvidia-fs 2.25.7" in r.summary
    assert "platform verification succeeded" in r.summary
    assert any(e.source == "gdscheck -p" or "gdscheck" in e.source for e in r.evidence)


def test_nvidia_force_compat_mode_fails(hosts):
    tree = hosts.copy("nvidia-h100")
    cf = tree / "etc/cufile.json"
    cf.write_text(cf.read_text().replace('"force_compat_mode": false', '"force_compat_mode": true'))
    r = hosts.run("nvidia-h100", tree=tree, checks=["nvidia-gds"]).get("nvidia-gds").result
    assert r.status.value == "fail" and "forces compatibility mode" in r.summary


def test_nvidia_kvikio_compat_on_warns(hosts):
    r = (
        hosts.run("nvidia-h100", checks=["nvidia-gds"], environ={"KVIKIO_COMPAT_MODE": "on"})
        .get("nvidia-gds")
        .result
    )
    assert r.status.value == "warn" and "KVIKIO_COMPAT_MODE" in r.summary


def test_kfd_bit_explains_host_false_on_new_builds(hosts):
    tree = hosts.copy("mi300x-healthy")
    dk = tree / "var/lib/dkms/amdgpu"
    (dk / "6.16.6-2255209.24.04").rename(dk / "6.16.13-2341068.24.04")
    for p in (tree / "sys/class/kfd/kfd/topology/nodes").glob("*/properties"):
        p.write_text(p.read_text().replace("capability 675521216", "capability 675521152"))
    cmds = yaml.safe_load((FIXTURES / "mi300x-healthy" / "commands.yaml").read_text())
    r = (
        hosts.run("mi300x-healthy", tree=tree, commands=cmds, checks=["kfd-capability"])
        .get("kfd-capability")
        .result
    )
    assert r.status.value == "ok" and "0 of 2" in r.summary
    assert any("2341068" in d and "False" in d for d in r.details)
