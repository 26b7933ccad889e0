"""Memory facts: ``/proc/meminfo`` and the memory cgroup a process is charged to.

The arena is a ``memfd`` (shmem). Its pages are charged to the memory cgroup of the process that
first touches each page: the daemon's with ``--prefault``, otherwise whichever engine writes a
chunk there first. So the limit that matters is the daemon's cgroup's (and, without
``--prefault``, the engines' too). cgroup v2 limits are ``memory.max`` (hard: the OOM killer) and
``memory.high`` (throttling), the smallest on the way up the tree; cgroup v1 has
``memory.limit_in_bytes``, where anything from 2^62 up means no limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infera.doctor.context import Context
from infera.doctor.facts.procs import cmdline
from infera.doctor.model import Evidence

V1_UNLIMITED = 1 << 62


def meminfo(ctx: Context) -> dict[str, int] | None:
    """``/proc/meminfo`` in bytes (``kB`` lines) or counts (``HugePages_*``)."""
    text = ctx.host.read("/proc/meminfo").text
    if text is None:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


@dataclass
class CgroupMemory:
    """The memory limit of one process's cgroup (None = no limit), and the file that set it."""

    who: str
    version: int | None = None
    path: str | None = None
    limit: int | None = None
    limit_file: str | None = None
    high: int | None = None
    high_file: str | None = None
    current: int | None = None
    error: str | None = None
    evidence: list[Evidence] = field(default_factory=list)


def _num(text: str | None, v1: bool = False) -> tuple[bool, int | None]:
    """(readable, bytes or None for "max"/unlimited)."""
    if text is None:
        return False, None
    t = text.strip()
    if t == "max":
        return True, None
    if not t.isdigit():
        return False, None
    n = int(t)
    return True, (None if v1 and n >= V1_UNLIMITED else n)


def _ancestors(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) if i else "" for i in range(len(parts), -1, -1)]


#: cgroup version -> (mount, limit file, usage file, throttle file or None)
CGROUP_FILES: dict[int, tuple[str, str, str, str | None]] = {
    1: ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", None),
    2: ("/sys/fs/cgroup", "memory.max", "memory.current", "memory.high"),
}


def cgroup_memory(ctx: Context, pid: int | str, who: str) -> CgroupMemory:
    """The effective memory limit of process ``pid`` (``self`` for the doctor's own)."""
    h = ctx.host
    out = CgroupMemory(who)
    src = f"/proc/{pid}/cgroup"
    read = h.read(src)
    if read.text is None:
        out.error = f"{src}: {read.error}"
        return out
    v2_path = v1_path = None
    for line in read.text.splitlines():
        hier, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hier == "0" and ctrls == "":
            v2_path = path.strip()
        elif "memory" in ctrls.split(","):
            v1_path = path.strip()
    out.evidence.append(Evidence(h.display(src), f"cgroup of {who}: " + (v1_path or v2_path or "?")))
    if v1_path is not None and h.is_dir("/sys/fs/cgroup/memory"):
        out.version, out.path = 1, v1_path
    elif v2_path is not None and h.exists("/sys/fs/cgroup/cgroup.controllers"):
        out.version, out.path = 2, v2_path
    else:
        out.error = "no memory cgroup (neither /sys/fs/cgroup/memory/ nor cgroup v2's /sys/fs/cgroup/cgroup.controllers)"
        return out
    base, limit_name, cur_name, high_name = CGROUP_FILES[out.version]
    dirs = [d for d in _ancestors(out.path) if h.is_dir(base + d)]
    if not dirs:
        # inside a cgroup namespace the path may not exist under this mount: the mount's root is ours
        dirs = [""]
    seen_any = False
    for d in dirs:
        f = f"{base}{d}/{limit_name}"
        ok, n = _num(h.value(f), v1=out.version == 1)
        if ok:
            seen_any = True
            out.evidence.append(Evidence(h.display(f), "max" if n is None else str(n)))
            if n is not None and (out.limit is None or n < out.limit):
                out.limit, out.limit_file = n, f
        if high_name:
            fh = f"{base}{d}/{high_name}"
            okh, nh = _num(h.value(fh))
            if okh and nh is not None and (out.high is None or nh < out.high):
                out.high, out.high_file = nh, fh
                out.evidence.append(Evidence(h.display(fh), str(nh)))
    ok, cur = _num(h.value(f"{base}{dirs[0]}/{cur_name}"))
    out.current = cur if ok else None
    if not seen_any:
        # the root cgroup has no memory.max: no limit there
        if dirs == [""] and out.version == 2 and not h.exists(f"{base}/{limit_name}"):
            out.evidence.append(
                Evidence(h.display(f"{base}/{limit_name}"), "absent (the root cgroup: no limit)")
            )
            return out
        out.error = f"{base}{dirs[0]}/{limit_name} not readable"
    return out


def describe_process(ctx: Context, pid: int) -> str:
    argv = cmdline(ctx, pid) or []
    return " ".join(argv[:4])[:80] or f"pid {pid}"
