"""``/dev/shm``: big enough for the engines, and not full of files a crashed engine left behind.

kvd's arena is a memfd and never touches ``/dev/shm``. vLLM does: its multi-process broadcast
queue (Python ``SharedMemory``, ``psm_*``), NCCL's shared-memory transport (``nccl-*``) and, from
vLLM 0.33, its own CPU offload region (``vllm_offload_*.mmap``, sized like the offload tier).
Docker gives a container 64 MiB unless told otherwise, and files of a process that crashed stay
until someone removes them, so the next engine start fails or falls back.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from infera.doctor.checks import plural
from infera.doctor.context import Context
from infera.doctor.facts.procs import open_under
from infera.doctor.facts.storage import parse_mountinfo
from infera.doctor.model import CheckResult, Evidence, Status, unknown, worst
from infera.doctor.registry import check
from infera.errors import UsageError
from infera.units import format_size, parse_size

SHM = "/dev/shm"
MIN_SIZE = 1 << 30  # below this vLLM's broadcast queue, NCCL and PyTorch workers run short
FULL = 0.9
#: (pattern, whose files): the files in /dev/shm that are ours or vLLM's to judge.
PATTERNS = (
    (re.compile(r"vllm_offload_.*"), "vLLM CPU offload region"),
    (re.compile(r"psm_[0-9a-f]+"), "Python SharedMemory (vLLM's broadcast queue)"),
    (re.compile(r"nccl-.*"), "NCCL shared-memory transport"),
    (re.compile(r"(infera|kvd)[-_].*"), "infera/kvd"),
)


@dataclass
class ShmFile:
    name: str
    size: int
    kind: str
    users: set[int]


def _size_option(superopts: str) -> int | None:
    for opt in superopts.split(","):
        k, _, v = opt.partition("=")
        if k == "size" and v:
            try:
                return parse_size(v)
            except UsageError:  # size=50% and other forms: statvfs on a live root says
                return None
    return None


def _usage(ctx: Context) -> tuple[int | None, int | None, str]:
    """(size, free, where from) of /dev/shm."""
    h = ctx.host
    if ctx.live:
        try:
            st = os.statvfs(SHM)
            return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, f"statvfs({SHM})"
        except OSError:
            pass
    mounts = [m for m in parse_mountinfo(h.text("/proc/self/mountinfo") or "") if m.mountpoint == SHM]
    if not mounts:
        return None, None, "/proc/self/mountinfo"
    size = _size_option(mounts[-1].superopts)
    return size, None, "/proc/self/mountinfo"


def _files(ctx: Context) -> list[ShmFile]:
    h = ctx.host
    users = open_under(ctx, SHM).users
    out = []
    for name in h.listdir(SHM):
        kind = next((k for p, k in PATTERNS if p.fullmatch(name)), None)
        if kind is None:
            continue
        try:
            size = h.path(f"{SHM}/{name}").lstat().st_size
        except OSError:
            continue
        out.append(ShmFile(name, size, kind, users.get(f"{SHM}/{name}", set())))
    return out


@check("dev-shm", "/dev/shm size and stale engine files", "memory", order=20)
def dev_shm(ctx: Context) -> CheckResult:
    h = ctx.host
    size, free, src = _usage(ctx)
    if size is None and not h.is_dir(SHM):
        return unknown(
            f"no {SHM} here (not in {src}, no directory)", [Evidence(h.display(src), "no /dev/shm mount")]
        )
    files = _files(ctx)
    if free is None and size is not None:
        # a fixture tree or a mounted host: what the files take
        total = 0
        for name in h.listdir(SHM):
            try:
                total += h.path(f"{SHM}/{name}").lstat().st_size
            except OSError:
                pass
        free = max(0, size - total)
    ev = [
        Evidence(
            h.display(src),
            f"{SHM}: size {format_size(size) if size else '?'}, free {format_size(free) if free is not None else '?'}",
        )
    ]
    scan = open_under(ctx, SHM)
    stale = [f for f in files if not f.users]
    for f in files:
        ev.append(
            Evidence(
                h.display(f"{SHM}/{f.name}"),
                f"{format_size(f.size)}, {f.kind}, "
                + (
                    f"open in pid {', '.join(map(str, sorted(f.users)))}" if f.users else "open in no process"
                ),
            )
        )
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    details = [
        "kvd's arena is a memfd: it does not use /dev/shm (its limit is the memory cgroup, see cgroup-memory)"
    ]
    if scan.unreadable:
        details.append(
            f"{plural(scan.unreadable, 'process', 'processes')} could not be inspected (not root?): a file they hold would be shown as stale"
        )
    if size is not None and size < MIN_SIZE:
        findings.append(
            (
                Status.WARN,
                f"{SHM} is only {format_size(size)}: vLLM's multi-process queue, NCCL and PyTorch workers need more",
            )
        )
        fixes.append(
            "give the container a larger /dev/shm (docker run --shm-size 16g; Kubernetes: an emptyDir with medium: Memory)"
        )
    if stale:
        names = ", ".join(f.name for f in stale[:5]) + (
            f" and {len(stale) - 5} more" if len(stale) > 5 else ""
        )
        findings.append(
            (
                Status.WARN,
                f"{plural(len(stale), 'file')} no process has open ({format_size(sum(f.size for f in stale))}): {names}",
            )
        )
        fixes.append(
            "stop the engines, then remove the stale files: "
            + " ".join(f"{SHM}/{f.name}" for f in stale[:5])
            + (" ..." if len(stale) > 5 else "")
        )
    if size and free is not None and free < size * (1 - FULL):
        findings.append((Status.WARN, f"{SHM} is {100 - 100 * free // size}% full"))
        fixes.append(f"free space in {SHM} (stale files above first)")
    status = worst((s for s, _ in findings), Status.OK)
    if findings:
        summary = "; ".join(t for _, t in findings)
    else:
        summary = f"{SHM} {format_size(size) if size else '?'}" + (
            f", {plural(len(files), 'engine file')}, all in use" if files else ", no stale engine files"
        )
    return CheckResult(status, summary, ev, fix="; ".join(fixes) or None, details=details)
