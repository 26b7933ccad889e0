"""Storage for ``--long-path``: mount, filesystem, block stack, O_DIRECT.

Fails only when the long tier cannot work at all; everything that merely keeps GPU-direct on its
POSIX fallback is a warn that says so. md RAID is never a pass or a fail: hipFile's support for it
depends on the release and the RAID level, so the doctor says how to prove it with a read that is
not allowed to fall back.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from infera.doctor.context import Context
from infera.doctor.facts.pci import inventory
from infera.doctor.facts.storage import (
    NETWORK_FS,
    block_source,
    classify,
    ext4_data_mode,
    mount_for,
    odirect_probe,
    parse_mountinfo,
)
from infera.doctor.model import CheckResult, Evidence, Notes, Status, skip, unknown
from infera.doctor.registry import check
from infera.units import format_size

MD_FASTPATH_LEVELS = ("linear", "raid0", "raid1", "raid10")
VERIFY_MD = (
    "prove the fast path on this array: read one chunk file with HIPFILE_ALLOW_COMPAT_MODE=false "
    "(hipFile then fails instead of falling back) and watch `dmesg` for AIS errors; ais-check's "
    "HIPFILE=no for md keys off the backing type, not a measurement"
)


def _existing(path: str, exists: Callable[[str], bool]) -> str:
    p = path
    while p not in ("", "/") and not exists(p):
        p = os.path.dirname(p)
    return p or "/"


@check("storage", "Long-tier storage (--long-path)", "storage", order=10)
def storage(ctx: Context) -> CheckResult:
    long_path = ctx.options.long_path
    if not long_path:
        return skip(
            "no --long-path given", fix=None, details=["pass --long-path DIR (the daemon's --long-path)"]
        )
    h = ctx.host
    if not long_path.startswith("/"):
        long_path = os.path.abspath(long_path) if ctx.live else "/" + long_path
    notes = Notes()
    if ctx.live:
        real = os.path.realpath(long_path)
        present = _existing(real, os.path.exists)
    else:
        real = h.resolve(long_path)
        present = _existing(real, h.exists)
    if present != real:
        notes.evidence.append(
            Evidence(long_path, f"does not exist yet; nearest existing parent {present}", "probe")
        )
        notes.findings.append((Status.OK, f"{long_path} does not exist yet (the daemon creates it)"))
    elif not (os.path.isdir(real) if ctx.live else h.is_dir(real)):
        return CheckResult(
            Status.FAIL,
            f"{long_path} is not a directory",
            notes.evidence,
            fix="point --long-path at a directory",
        )
    mi = h.read("/proc/self/mountinfo")
    if mi.text is None:
        return unknown(f"cannot read {h.display('/proc/self/mountinfo')} ({mi.error})", notes.evidence)
    mount = mount_for(parse_mountinfo(mi.text), present)
    if mount is None:
        return unknown(f"no mount found for {real}", notes.evidence)
    notes.evidence.append(
        Evidence(
            h.display("/proc/self/mountinfo"),
            f"{mount.mountpoint} {mount.fstype} {mount.source} ({mount.majmin}) {mount.superopts}",
        )
    )
    fs = mount.fstype
    if fs == "xfs":
        fs_text = "xfs"
    elif fs == "ext4":
        mode, src = ext4_data_mode(mount, h)
        fs_text = f"ext4 (data={mode})"
        notes.evidence.append(Evidence(src, f"data={mode}", "note"))
        if mode != "ordered":
            notes.findings.append((Status.WARN, f"ext4 with data={mode}: hipFile needs data=ordered"))
            notes.fixes.append("remount without data=journal/writeback (data=ordered is the default)")
    elif fs in NETWORK_FS:
        fs_text = fs
        rdma = mount.opt("proto") == "rdma"
        notes.findings.append(
            (
                Status.WARN,
                f"network filesystem {fs}{' over RDMA' if rdma else ''}: GPU-direct over NFS is experimental "
                "(amdgpu-dkms 31.40+, HIPFILE_UNSUPPORTED_FILE_SYSTEMS=true); the POSIX path works",
            )
        )
    elif fs in ("tmpfs", "ramfs"):
        fs_text = fs
        notes.findings.append(
            (
                Status.WARN,
                f"{fs} is RAM: the long tier would not survive a reboot and competes with the arena",
            )
        )
        notes.fixes.append("put --long-path on local NVMe (xfs or ext4)")
    else:
        fs_text = fs
        notes.findings.append((Status.WARN, f"{fs} is not xfs or ext4: GPU-direct falls back to POSIX there"))
        notes.fixes.append("for GPU-direct, use xfs or ext4 (data=ordered) on local NVMe")
    backing = _backing(ctx, mount.majmin, mount.source, notes)
    _udev_record(ctx, mount.majmin, mount.source, notes)
    if ctx.live:
        _live_probe(present, notes)
    else:
        notes.evidence.append(
            Evidence(
                "O_DIRECT probe", "not run: --root is a host tree, not this machine's filesystem", "probe"
            )
        )
    return notes.result(f"{long_path}: {fs_text} on {backing}")


def _on_block_device(majmin: str, source: str) -> bool:
    """False for mounts with no block device behind them (NFS, tmpfs, overlay: major 0)."""
    return not majmin.startswith("0:") and source.startswith("/dev/")


def _udev_record(
    ctx: Context,
    majmin: str,
    source: str,
    notes: Notes,
) -> None:
    """cuFile registers a file only after reading its volume's udev properties (ID_FS_USAGE),
    compat mode included. Without the udev record every cuFileHandleRegister fails with 5027
    (seen on the H200 microVM, which has no udev database), and GPU-direct falls back."""
    if not _on_block_device(majmin, source):
        return  # nothing for udev to describe
    h = ctx.host
    path = f"/run/udev/data/b{majmin}"
    text = h.text(path)
    if text is not None and "E:ID_FS_USAGE=" in text:
        notes.evidence.append(
            Evidence(h.display(path), "udev record with ID_FS_USAGE (cuFile can register files here)")
        )
        return
    notes.evidence.append(
        Evidence(h.display(path), "missing" if text is None else "present, without ID_FS_USAGE")
    )
    if not inventory(ctx).nvidia:
        return  # only cuFile is known to need it
    notes.findings.append(
        (
            Status.WARN,
            f"no udev record for {source} ({majmin}): cuFile cannot read the volume's attributes, "
            "so every cuFileHandleRegister fails (error 5027, compat mode too) and GPU-direct falls "
            "back to the arena path",
        )
    )
    notes.fixes.append(
        "run udev (systemd-udevd, then `udevadm trigger --subsystem-match=block`); in a container, "
        "mount the host's /run/udev read-only (-v /run/udev:/run/udev:ro)"
    )


def _backing(
    ctx: Context,
    majmin: str,
    source: str,
    notes: Notes,
) -> str:
    if not _on_block_device(majmin, source):
        return source
    src = block_source(ctx)
    syspath = src.lookup(majmin)
    if syspath is None:
        notes.evidence.append(Evidence(f"/sys/dev/block/{majmin}", "not found", "file"))
        notes.findings.append((Status.UNKNOWN, f"block device {majmin} not found in sysfs"))
        return source
    node = classify(src, syspath)
    notes.evidence.append(Evidence(f"block stack ({src.name})", node.describe(), "file"))
    props = src.props(syspath)
    if props:
        notes.evidence.append(
            Evidence(f"udev {syspath}", ", ".join(f"{k}={v}" for k, v in props.items()), "file")
        )
    leaves = node.leaves()
    all_nvme = all(leaf.kind == "nvme" for leaf in leaves)
    fabric = [
        leaf for leaf in leaves if leaf.kind == "nvme" and leaf.detail.get("transport") not in ("pcie", "?")
    ]
    md = node.find("md")
    lvm = node.find("lvm")
    if md is not None:
        level = md.detail.get("level", "?")
        members = ", ".join(leaf.name for leaf in md.leaves())
        what = f"md {level} of {len(md.leaves())} ({members})"
        if level in MD_FASTPATH_LEVELS and all_nvme:
            notes.findings.append(
                (
                    Status.WARN,
                    f"ais-check reports HIPFILE=no for md, yet {level} on NVMe can serve the fast path: verify it",
                )
            )
            notes.fixes.append(VERIFY_MD)
        elif level in MD_FASTPATH_LEVELS:
            notes.findings.append(
                (Status.WARN, "not all md members are NVMe, so GPU-direct falls back to POSIX")
            )
        else:
            notes.findings.append(
                (
                    Status.WARN,
                    f"{level} routes I/O through the stripe cache, so GPU-direct always falls back",
                )
            )
            notes.fixes.append(
                "for GPU-direct use raid0/raid1/raid10 (or plain NVMe); the POSIX path is fine on this array"
            )
        desc = what
    elif lvm is not None:
        desc = f"LVM {lvm.detail.get('dm_name', '')} on {', '.join(leaf.name for leaf in leaves)}"
        if not all_nvme:
            notes.findings.append((Status.WARN, "LVM not entirely on NVMe: GPU-direct falls back to POSIX"))
    elif all_nvme:
        desc = f"NVMe {', '.join(leaf.name for leaf in leaves)}"
    else:
        kinds = ", ".join(sorted({leaf.kind for leaf in leaves}))
        desc = f"{node.name} ({kinds})"
        notes.findings.append((Status.WARN, f"backed by {kinds}, not NVMe: GPU-direct falls back to POSIX"))
        notes.fixes.append("for GPU-direct, put --long-path on local NVMe")
    if node.find("crypt") or node.find("mpath"):
        notes.findings.append(
            (Status.WARN, "dm-crypt or dm-multipath in the stack: GPU-direct falls back to POSIX")
        )
    if fabric:
        notes.findings.append(
            (
                Status.WARN,
                f"NVMe over fabrics ({fabric[0].detail.get('transport')}): experimental for GPU-direct",
            )
        )
    if any(leaf.kind == "nvme" for leaf in leaves):
        mp = ctx.host.value("/sys/module/nvme_core/parameters/multipath")
        if mp is not None:
            notes.evidence.append(
                Evidence(ctx.host.display("/sys/module/nvme_core/parameters/multipath"), mp)
            )
        if mp == "Y":
            notes.findings.append((Status.WARN, "native NVMe multipath is on (nvme_core multipath=Y)"))
            notes.fixes.append(
                "set `options nvme_core multipath=N` (hipFile's install guide asks for it) and reboot"
            )
    return desc


def _live_probe(directory: str, notes: Notes) -> None:
    probe = odirect_probe(directory)
    notes.evidence.append(
        Evidence(f"O_DIRECT probe in {directory}", f"{probe.result}: {probe.detail}", "probe")
    )
    if probe.result == "no":
        notes.findings.append(
            (Status.WARN, "O_DIRECT does not work there: GPU-direct cannot read these files")
        )
        notes.fixes.append("use a filesystem with O_DIRECT support (xfs, ext4) for GPU-direct")
    elif probe.result == "unverified":
        notes.findings.append((Status.UNKNOWN, f"O_DIRECT unverified ({probe.detail})"))
    if not os.access(directory, os.W_OK):
        notes.findings.append((Status.WARN, f"{directory} is not writable by uid {os.getuid()}"))
        notes.fixes.append("make the directory writable by the daemon's user")
    try:
        du = shutil.disk_usage(directory)
        notes.evidence.append(
            Evidence(
                f"statvfs {directory}", f"{format_size(du.free)} free of {format_size(du.total)}", "probe"
            )
        )
    except OSError:
        pass
