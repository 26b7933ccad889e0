"""Processes as the host view shows them: ``/proc/<pid>/`` cmdline, environ, limits, status,
cgroup, open files and mappings.

Read through the host view (not psutil), so a fixture tree answers with its own ``/proc`` and a
mounted host with its. On this machine the doctor's own pid is left out. Everything returns None
(or an empty answer) for a process that went away or cannot be read, never raises.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from infera.doctor.context import Context

CAP_IPC_LOCK = 14
UNLIMITED = "unlimited"


def pids(ctx: Context) -> list[int]:
    """Every pid under ``/proc`` of the host view (the doctor's own left out on a live root)."""
    return ctx.memo("procs.pids", _pids)


def _pids(ctx: Context) -> list[int]:
    me = os.getpid() if ctx.live else -1
    return sorted(int(n) for n in ctx.host.listdir("/proc") if n.isdigit() and int(n) != me)


def cmdline(ctx: Context, pid: int | str) -> list[str] | None:
    text = ctx.host.read(f"/proc/{pid}/cmdline").text
    if text is None:
        return None
    return [w for w in text.split("\0") if w] or None


def environ(ctx: Context, pid: int | str) -> dict[str, str] | None:
    text = ctx.host.read(f"/proc/{pid}/environ").text
    if text is None:
        return None
    out: dict[str, str] = {}
    for item in text.split("\0"):
        k, sep, v = item.partition("=")
        if sep and k:
            out[k] = v
    return out


@dataclass(frozen=True)
class Limit:
    """One line of ``/proc/<pid>/limits``: soft and hard (None = unlimited), and the unit."""

    soft: int | None
    hard: int | None
    unit: str


def limits(ctx: Context, pid: int | str) -> dict[str, Limit] | None:
    """``/proc/<pid>/limits`` by resource name (``Max locked memory``, ...)."""
    text = ctx.host.read(f"/proc/{pid}/limits").text
    if text is None:
        return None
    out: dict[str, Limit] = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)\s*(\S*)", line)
        if m:
            out[m.group(1)] = Limit(_lim(m.group(2)), _lim(m.group(3)), m.group(4))
    return out


def _lim(text: str) -> int | None:
    return None if text == UNLIMITED else int(text) if text.isdigit() else None


def status(ctx: Context, pid: int | str) -> dict[str, str] | None:
    text = ctx.host.read(f"/proc/{pid}/status").text
    if text is None:
        return None
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines()) if k}


def has_capability(ctx: Context, pid: int | str, cap: int) -> bool | None:
    """Whether ``cap`` is in the process's effective set (``CapEff``); None when unreadable."""
    st = status(ctx, pid)
    if not st or "CapEff" not in st:
        return None
    try:
        return bool(int(st["CapEff"], 16) >> cap & 1)
    except ValueError:
        return None


def uid(ctx: Context, pid: int | str) -> int | None:
    st = status(ctx, pid)
    try:
        return int(st["Uid"].split()[1]) if st and "Uid" in st else None
    except (ValueError, IndexError):
        return None


# -- kvd daemons ------------------------------------------------------------------------------------


@dataclass
class KvdProcess:
    """A running ``python -m infera.kvd`` / ``kvd serve``: its pid and the words after the command."""

    pid: int
    argv: list[str]
    flags: list[str]

    @property
    def label(self) -> str:
        return f"kvd daemon pid {self.pid}"


def kvd_flags(argv: list[str]) -> list[str] | None:
    """The flag words of a kvd daemon command line, or None when ``argv`` is not one."""
    for i, word in enumerate(argv):
        if word == "-m" and i + 1 < len(argv) and argv[i + 1] == "infera.kvd":
            rest = argv[i + 2 :]
            return rest[1:] if rest[:1] == ["serve"] else rest
        if i < 3 and os.path.basename(word) == "kvd" and argv[i + 1 : i + 2] == ["serve"]:
            return argv[i + 2 :]
    return None


def kvd_daemons(ctx: Context) -> list[KvdProcess]:
    return ctx.memo("procs.kvd", _kvd_daemons)


def _kvd_daemons(ctx: Context) -> list[KvdProcess]:
    out = []
    for pid in pids(ctx):
        argv = cmdline(ctx, pid)
        flags = kvd_flags(argv) if argv else None
        if argv and flags is not None:
            out.append(KvdProcess(pid, argv, flags))
    return out


def alive(ctx: Context, pid: int) -> bool:
    return ctx.host.exists(f"/proc/{pid}")


# -- open files -------------------------------------------------------------------------------------


@dataclass
class OpenFiles:
    """Which processes hold files under a directory open or mapped, and how many could not be read."""

    users: dict[str, set[int]] = field(default_factory=dict)
    unreadable: int = 0
    scanned: int = 0


def open_under(ctx: Context, directory: str) -> OpenFiles:
    """Files under ``directory`` that some process has open (``/proc/*/fd``) or mapped (``maps``)."""
    return ctx.memo(f"procs.open:{directory}", lambda c: _open_under(c, directory))


def _open_under(ctx: Context, directory: str) -> OpenFiles:
    prefix = directory.rstrip("/") + "/"
    out = OpenFiles()
    for pid in pids(ctx):
        fd_dir = f"/proc/{pid}/fd"
        names = ctx.host.listdir(fd_dir)
        maps = ctx.host.read(f"/proc/{pid}/maps").text
        if not names and maps is None:
            if ctx.host.exists(f"/proc/{pid}/cmdline"):
                out.unreadable += 1
            continue
        out.scanned += 1
        for name in names:
            target = ctx.host.readlink(f"{fd_dir}/{name}")
            if target and target.startswith(prefix):
                out.users.setdefault(target.removesuffix(" (deleted)"), set()).add(pid)
        for line in (maps or "").splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith(prefix):
                out.users.setdefault(parts[5].removesuffix(" (deleted)"), set()).add(pid)
    return out
