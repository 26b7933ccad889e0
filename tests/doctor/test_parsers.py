"""Parsers of host formats, on samples in every shape the field produces."""

from __future__ import annotations

import pytest

from infera.doctor.facts import aischeck
from infera.doctor.facts.nvidia import parse_cufile_json, parse_gdscheck, parse_nvfs_stats, truthy
from infera.doctor.facts.pci import KfdNode, bar0_size, parse_kfd_properties
from infera.doctor.facts.storage import mount_for, parse_mountinfo
from infera.doctor.facts.versions import (
    dkms_build,
    parse_amdgpu_dkms_package,
    parse_dkms_status,
    parse_module_version,
    parse_rocm_version,
    parse_version,
)


@pytest.mark.parametrize(
    ("raw", "module", "package"),
    [
        ("6.16.6", (6, 16, 6), None),
        ("6.16.13\n", (6, 16, 13), None),
        ("6.19.14.31400000", (6, 19, 14), (31, 40, 0)),
        ("6.16.6.30200100", (6, 16, 6), (30, 20, 1)),
    ],
)
def test_module_versions_are_not_semver(raw, module, package):
    v = parse_module_version(raw)
    assert v is not None and v.module == module and v.package == package


@pytest.mark.parametrize("raw", ["", "\n", None, "garbage"])
def test_empty_module_version_means_in_kernel(raw):
    assert parse_module_version(raw) is None


def test_version_ordering_uses_numbers_not_strings():
    assert parse_version("6.16.13") > parse_version("6.16.6")
    assert parse_version("6.9") < parse_version("6.16.6")


def test_dkms_status_both_shapes():
    text = (
        "amdgpu/6.16.6-2255209.24.04, 6.8.0-101-generic, x86_64: installed\n"
        "amdgpu, 6.16.13-2327937.24.04, 6.8.0-101, x86_64: installed (Original modules exist)\n"
        "nvidia-fs/2.25.7, 6.8.0-101-generic, x86_64: built\n"
    )
    e = parse_dkms_status(text)
    assert [(x.module, x.version, x.kernel, x.arch, x.state) for x in e] == [
        ("amdgpu", "6.16.6-2255209.24.04", "6.8.0-101-generic", "x86_64", "installed"),
        ("amdgpu", "6.16.13-2327937.24.04", "6.8.0-101", "x86_64", "installed"),
        ("nvidia-fs", "2.25.7", "6.8.0-101-generic", "x86_64", "built"),
    ]
    assert [x.build for x in e] == [2255209, 2327937, None]


def test_dkms_build_number():
    assert dkms_build("6.16.13-2278356.24.04") == 2278356
    assert dkms_build("6.16.6") is None


def test_debian_package_version_decodes_driver_release():
    v = parse_amdgpu_dkms_package("1:6.16.6.30200100-2255209.24.04")
    assert (v.module, v.package, v.build) == ((6, 16, 6), (30, 20, 1), 2255209)
    assert parse_amdgpu_dkms_package("1:6.16.6.30200000-2238411.24.04").package == (30, 20, 0)


@pytest.mark.parametrize(("raw", "want"), [("7.2.0\n", (7, 2, 0)), ("6.4.0-15158\n", (6, 4, 0)), ("", None)])
def test_rocm_version_file(raw, want):
    assert parse_rocm_version(raw) == want


def _summary(values, names=None):
    names = names or ["Kernel P2PDMA support", "HIP runtime", "amdgpu", "hipFile-capable volume"]
    return "".join(f"\t{n:<24}: {v}\n" for n, v in zip(names, values, strict=False))


def test_ais_check_summary_has_no_amdgpu_colon_token():
    out = "\nLinux h 6.8.0 #1 SMP x86_64\n\nAIS support in:\n" + _summary(["True", "True", "False", "True"])
    assert "amdgpu:" not in out
    p = aischeck.parse(out)
    assert p.get("amdgpu") is False and p.get("HIP runtime") is True
    assert p.banner == "Linux h 6.8.0 #1 SMP x86_64"


def test_ais_check_oldest_three_line_output():
    out = "\nLinux h 6.8.0 x86_64\n\nAIS support in:\n\tHIP runtime  : True\n\tamdgpu       : True\n"
    p = aischeck.parse(out)
    assert p.components == {"HIP runtime": True, "amdgpu": True}


def test_ais_check_volume_table_keeps_cells_with_spaces():
    out = (
        "\nLinux h\n\nMounted volumes:\n"
        "MOUNTPOINT      FSTYPE          DEVICE     BACKING  O_DIRECT    HIPFILE\n"
        "/               ext4 (ordered)  nvme0n1p2  nvme     yes         yes    \n"
        "/nvme/kvd-long  xfs             md0        md       yes         no     \n"
        "\nAIS support in:\n" + _summary(["True"] * 4)
    )
    p = aischeck.parse(out)
    assert [(v.mountpoint, v.fstype, v.backing, v.hipfile) for v in p.volumes] == [
        ("/", "ext4 (ordered)", "nvme", "yes"),
        ("/nvme/kvd-long", "xfs", "md", "no"),
    ]


def test_ais_check_verbose_and_filesystems_variant():
    out = (
        "\nLinux h\n\nFound these HIP libraries (some may refer to the same library):\n"
        "\t/opt/rocm-7.2.0/lib/libamdhip64.so.7.2.26015 (AIS supported)\n\n"
        "Supported filesystems:\n  xfs\n  ext4\n\nAIS support in:\n" + _summary(["True", "True", "True"])
    )
    p = aischeck.parse(out)
    assert p.libraries == ["/opt/rocm-7.2.0/lib/libamdhip64.so.7.2.26015 (AIS supported)"]
    assert p.filesystems == ["xfs", "ext4"]
    assert p.get("amdgpu") is True


def test_ais_check_stderr_notes():
    err = (
        "No kernel config files found!\n"
        "WARNING: SR-IOV virtual function GPU(s) detected: 0000:01:00.0 (AMD Instinct MI300X VF).\n"
        "hipFile's fast path is not available on GPU virtual functions; I/O will fall back.\n"
    )
    p = aischeck.parse("AIS support in:\n" + _summary(["False", "True", "True", "True"]), err)
    assert p.no_kernel_config
    assert p.vf_warning and "0000:01:00.0" in p.vf_warning


def test_mountinfo_unescapes_and_picks_longest_mount():
    text = (
        "29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro\n"
        "41 29 259:3 / /nvme/kvd\\040long rw,noatime shared:29 - xfs /dev/nvme1n1 rw,attr2\n"
        "42 29 0:50 / /mnt/nfs rw - nfs4 server:/export rw,vers=4.2,proto=rdma\n"
    )
    mounts = parse_mountinfo(text)
    assert mounts[1].mountpoint == "/nvme/kvd long"
    assert mount_for(mounts, "/nvme/kvd long/x").fstype == "xfs"
    assert mount_for(mounts, "/nvme/kvd").mountpoint == "/"
    assert mount_for(mounts, "/mnt/nfs/a").opt("proto") == "rdma"


def test_kfd_properties_and_gfx_name():
    props = parse_kfd_properties("simd_count 1216\ngfx_target_version 90402\ncapability 675521216\n")
    node = KfdNode("1", props)
    assert node.is_gpu and node.gfx == "gfx942" and node.capability & 0x40
    assert KfdNode("2", {"simd_count": 1, "gfx_target_version": 90010}).gfx == "gfx90a"


def test_bar0_size_from_resource():
    res = "0x0000008000000000 0x000000bfffffffff 0x000000000014220c\n0x0 0x0 0x0\n"
    assert bar0_size(res) == 256 << 30
    assert bar0_size("0x0000000000000000 0x0000000000000000 0x0\n") is None


def test_nvfs_stats_counters():
    text = (
        "GDS Version: 1.12.0.25\nNVFS statistics(ver: 4.0)\nNVFS Driver(version: 2.25.7)\n"
        "Reads : n=10 ok=10 err=0 readMiB=40 io_state_err=0\nOps : Read=3 Write=0 BatchIO=0\n"
        "GPU 0000:18:00.0  uuid:x : Registered_MiB=0 Cache_MiB=0 max_pinned_MiB=2\n"
    )
    s = parse_nvfs_stats(text)
    assert (s.version, s.driver) == ("1.12.0.25", "2.25.7")
    assert s.ops == {"Read": 3, "Write": 0, "BatchIO": 0} and s.reads["readMiB"] == 40 and len(s.gpus) == 1


def test_gdscheck_sections():
    text = (
        " GDS release version: 1.12.0.25\n =====================\n DRIVER CONFIGURATION:\n"
        " =====================\n NVMe               : Supported\n NVMe P2PDMA        : Unsupported\n"
        " =====================\n CUFILE CONFIGURATION:\n =====================\n"
        " properties.use_compat_mode : true\n =========\n GPU INFO:\n =========\n"
        " GPU index 0 NVIDIA H100 80GB HBM3 bar:1 bar size (MiB):131072 supports GDS\n"
        " ==============\n PLATFORM INFO:\n ==============\n IOMMU: disabled\n Platform verification succeeded\n"
    )
    g = parse_gdscheck(text)
    assert g.release == "1.12.0.25" and g.drivers["NVMe"] == "Supported"
    assert g.properties["properties.use_compat_mode"] == "true"
    assert g.platform["IOMMU"] == "disabled" and g.verified is True and len(g.gpus) == 1


def test_cufile_json_with_comments_and_trailing_commas():
    text = (
        '{\n // a comment with "quotes"\n "properties": {"url": "http://x", "force_compat_mode": true,},\n}\n'
    )
    assert parse_cufile_json(text)["properties"] == {"url": "http://x", "force_compat_mode": True}


@pytest.mark.parametrize(
    ("raw", "want"), [("ON", True), ("yes", True), ("0", False), ("AUTO", None), (None, None)]
)
def test_kvikio_compat_values(raw, want):
    assert truthy(raw) is want
