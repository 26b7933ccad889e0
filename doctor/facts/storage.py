"""Where a long-tier path lives: its mount, filesystem, block stack and whether O_DIRECT works.

The block stack is walked from the mount's ``maj:min`` down to its leaves (partition -> disk,
md -> members, device-mapper -> slaves). On this machine it goes through pyudev; on a fixture
tree or a mounted host it reads the same sysfs attributes from the tree.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Protocol

from infera.doctor.context import Context
from infera.doctor.host import HostView

NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "ceph", "glusterfs", "lustre", "beegfs", "9p", "fuse.sshfs")


@dataclass
class Mount:
    mount_id: str
    majmin: str
    root: str
    mountpoint: str
    options: str
    fstype: str
    source: str
    superopts: str

    def opt(self, name: str) -> str | None:
        for o in (self.options + "," + self.superopts).split(","):
            k, _, v = o.partition("=")
            if k == name:
                return v or "true"
        return None


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(text: str) -> list[Mount]:
    out = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, right = line.split(" - ", 1)
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        out.append(
            Mount(
                a[0],
                a[2],
                _unescape(a[3]),
                _unescape(a[4]),
                a[5],
                b[0],
                _unescape(b[1]),
                b[2] if len(b) > 2 else "",
            )
        )
    return out


def mount_for(mounts: list[Mount], path: str) -> Mount | None:
    """The mount that holds ``path``: the longest mountpoint prefix, the last one mounted on ties."""
    best: Mount | None = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (
            best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")
        ):
            best = m
    return best


def ext4_data_mode(m: Mount, host: HostView) -> tuple[str, str]:
    """(mode, where it came from). Absent ``data=`` means the default, ``ordered``."""
    mode = m.opt("data")
    if mode:
        return mode, "mount options"
    dev = m.source.rsplit("/", 1)[-1]
    opts = host.text(f"/proc/fs/ext4/{dev}/options")
    if opts:
        for line in opts.splitlines():
            if line.startswith("data="):
                return line.split("=", 1)[1].strip(), host.display(f"/proc/fs/ext4/{dev}/options")
    return "ordered", "default (no data= option)"


# -- block stack --------------------------------------------------------------------------------


class BlockSource(Protocol):
    name: str

    def lookup(self, majmin: str) -> str | None: ...

    def attr(self, syspath: str, name: str) -> str | None: ...

    def has(self, syspath: str, name: str) -> bool: ...

    def slaves(self, syspath: str) -> list[str]: ...

    def props(self, syspath: str) -> dict[str, str]: ...


class SysfsSource:
    """Block devices read from the host tree's ``/sys`` (fixtures, mounted hosts)."""

    name = "sysfs"

    def __init__(self, host: HostView) -> None:
        self.host = host

    def lookup(self, majmin: str) -> str | None:
        p = f"/sys/dev/block/{majmin}"
        return self.host.resolve(p) if self.host.exists(p) else None

    def attr(self, syspath: str, name: str) -> str | None:
        return self.host.value(f"{syspath}/{name}")

    def has(self, syspath: str, name: str) -> bool:
        return self.host.exists(f"{syspath}/{name}")

    def slaves(self, syspath: str) -> list[str]:
        return [self.host.resolve(f"{syspath}/slaves/{s}") for s in self.host.listdir(f"{syspath}/slaves")]

    def props(self, syspath: str) -> dict[str, str]:
        return {}


class UdevSource(SysfsSource):
    """Block devices through pyudev on this machine; adds udev properties (model, DM and MD names)."""

    name = "pyudev"

    def __init__(self, host: HostView) -> None:
        super().__init__(host)
        import pyudev

        self._udev = pyudev
        self.context = pyudev.Context()

    def lookup(self, majmin: str) -> str | None:
        major, minor = (int(x) for x in majmin.split(":"))
        try:
            dev = self._udev.Devices.from_device_number(self.context, "block", os.makedev(major, minor))
        except Exception:
            return None
        return str(dev.sys_path)

    def attr(self, syspath: str, name: str) -> str | None:
        try:
            dev = self._udev.Devices.from_sys_path(self.context, syspath)
            val = dev.attributes.get(name)
        except Exception:
            return super().attr(syspath, name)
        if val is None:
            return None
        return bytes(val).decode(errors="replace").strip()

    def props(self, syspath: str) -> dict[str, str]:
        try:
            dev = self._udev.Devices.from_sys_path(self.context, syspath)
        except Exception:
            return {}
        keep = (
            "DEVNAME",
            "DEVTYPE",
            "ID_MODEL",
            "ID_SERIAL_SHORT",
            "ID_BUS",
            "DM_NAME",
            "DM_UUID",
            "MD_LEVEL",
        )
        return {k: str(dev.properties[k]) for k in keep if k in dev.properties}


def block_source(ctx: Context) -> BlockSource:
    if ctx.live:
        try:
            return UdevSource(ctx.host)
        except Exception:
            pass
    return SysfsSource(ctx.host)


@dataclass
class BlockNode:
    name: str
    kind: str
    syspath: str
    detail: dict[str, str] = field(default_factory=dict)
    members: list[BlockNode] = field(default_factory=list)

    def leaves(self) -> list[BlockNode]:
        if not self.members:
            return [self]
        return [leaf for m in self.members for leaf in m.leaves()]

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.detail.items())
        head = f"{self.name} [{self.kind}{': ' + extra if extra else ''}]"
        if self.members:
            return f"{head} <- " + " + ".join(m.describe() for m in self.members)
        return head

    def find(self, kind: str) -> BlockNode | None:
        if self.kind == kind:
            return self
        for m in self.members:
            hit = m.find(kind)
            if hit:
                return hit
        return None


def classify(src: BlockSource, syspath: str, depth: int = 0) -> BlockNode:
    name = syspath.rstrip("/").rsplit("/", 1)[-1]
    if depth > 8:
        return BlockNode(name, "?", syspath)
    if src.has(syspath, "partition"):
        parent = syspath.rstrip("/").rsplit("/", 1)[0]
        inner = classify(src, parent, depth + 1)
        return BlockNode(name, "partition", syspath, {}, [inner])
    if name.startswith("md"):
        node = BlockNode(name, "md", syspath, {"level": src.attr(syspath, "md/level") or "?"})
    elif name.startswith("dm-"):
        uuid = src.attr(syspath, "dm/uuid") or ""
        kind = next(
            (k for p, k in (("LVM-", "lvm"), ("mpath-", "mpath"), ("CRYPT-", "crypt")) if uuid.startswith(p)),
            "dm",
        )
        node = BlockNode(name, kind, syspath, {"dm_name": src.attr(syspath, "dm/name") or "?"})
    elif re.match(r"nvme\d+(c\d+)?n\d+$", name):
        transport = src.attr(syspath, "device/transport") or ("pcie" if "/virtual/" not in syspath else "?")
        node = BlockNode(name, "nvme", syspath, {"transport": transport})
    elif re.match(r"(sd|hd|sr)[a-z]+$", name):
        node = BlockNode(name, "scsi", syspath)
    elif re.match(r"x?vd[a-z]+$", name):
        node = BlockNode(name, "virtio", syspath)
    elif name.startswith(("loop", "zram", "ram", "nbd", "rbd")):
        node = BlockNode(name, re.sub(r"\d+$", "", name), syspath)
    else:
        node = BlockNode(name, "other", syspath)
    if node.kind in ("md", "lvm", "mpath", "crypt", "dm"):
        node.members = [classify(src, s, depth + 1) for s in src.slaves(syspath)]
    return node


# -- O_DIRECT probe -----------------------------------------------------------------------------


@dataclass
class Probe:
    result: str  # "yes", "no" or "unverified"
    detail: str


def odirect_probe(directory: str) -> Probe:
    """Create, write, read back and remove a 4 KiB file with O_DIRECT in ``directory``."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return Probe("unverified", "this platform has no O_DIRECT")
    name = os.path.join(directory, f".kvd-doctor-odirect-{os.getpid()}-{secrets.token_hex(4)}")
    buf = mmap.mmap(-1, 4096)
    try:
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | flag, 0o600)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return Probe("no", "open with O_DIRECT failed: EINVAL (the filesystem does not support it)")
            return Probe("unverified", f"cannot create a probe file: {exc.strerror or exc}")
        try:
            buf.write(b"kvd-doctor".ljust(4096, b"\0"))
            os.pwrite(fd, buf, 0)
            back = mmap.mmap(-1, 4096)
            try:
                n = os.preadv(fd, [back], 0)
                same = n == 4096 and back[:10] == b"kvd-doctor"
            finally:
                back.close()
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return Probe("no", "aligned O_DIRECT write/read failed: EINVAL")
            return Probe("unverified", f"O_DIRECT I/O failed: {exc.strerror or exc}")
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
        if not same:
            return Probe("no", "O_DIRECT read returned different bytes than were written")
        return Probe("yes", "4 KiB O_DIRECT write and read-back succeeded")
    finally:
        buf.close()
