"""The memory cgroup limit against the arena: a limit below ``--max-bytes`` gets the daemon killed.

The arena is a memfd, and shmem pages count against the memory cgroup of whoever touches them
first; a container limited to less than the arena runs fine until the arena fills, then the
kernel's OOM killer ends the daemon (or an engine) under load.
"""

from __future__ import annotations

from infera.doctor.context import Context
from infera.doctor.facts.kvdconf import settings
from infera.doctor.facts.memory import cgroup_memory, meminfo
from infera.doctor.model import CheckResult, Evidence, Status, fail, ok, unknown, warn
from infera.doctor.registry import check
from infera.units import format_size

#: The daemon's own memory besides the arena (interpreter, index, frames), with room to spare.
DAEMON_OVERHEAD = 256 << 20


def needed(ctx: Context) -> tuple[int, int, list[str]]:
    """(arena bytes, bytes the daemon needs in all, what the sum is made of)."""
    s = settings(ctx)
    arena = int(s.get("max_bytes") or 0)
    parts = [f"arena {format_size(arena)} ({s.where('max_bytes')})"]
    total = arena + DAEMON_OVERHEAD
    if s.get("long_backend") == "mooncake":
        extra = int(s.get("mooncake_segment_bytes") or 0) + int(s.get("mooncake_buffer_bytes") or 0)
        if extra:
            total += extra
            parts.append(f"Mooncake segment and buffer {format_size(extra)}")
    parts.append(f"daemon overhead {format_size(DAEMON_OVERHEAD)}")
    return arena, total, parts


@check("cgroup-memory", "memory cgroup limit vs the arena", "memory", order=10)
def cgroup_memory_check(ctx: Context) -> CheckResult:
    s = settings(ctx)
    arena, need, parts = needed(ctx)
    who, pid = (s.process.label, s.pid) if s.process else ("kvd doctor (no kvd daemon running)", "self")
    cg = cgroup_memory(ctx, pid if pid is not None else "self", who)
    ev = [*cg.evidence, Evidence("arena and headroom", " + ".join(parts) + f" = {format_size(need)}", "note")]
    details = []
    if s.process is None:
        details.append(
            "no kvd daemon is running here, so this is the doctor's own cgroup: run kvd doctor in the "
            "container the daemon runs in, or after starting the daemon"
        )
    if not s.get("prefault"):
        details.append(
            "without --prefault the arena's pages are charged to whichever process writes them first, "
            "so an engine container sharing the arena needs room for the chunks it writes as well"
        )
    mem = meminfo(ctx)
    total_ram = mem.get("MemTotal") if mem else None
    if total_ram:
        ev.append(Evidence(ctx.host.display("/proc/meminfo"), f"MemTotal {format_size(total_ram)}"))
    fix_size = f"give the daemon's container at least {format_size(need)} (docker run --memory, Kubernetes resources.limits.memory)"
    if total_ram and arena > total_ram:
        return fail(
            f"the arena ({format_size(arena)}) is larger than this host's RAM ({format_size(total_ram)})",
            ev,
            fix=f"lower --max-bytes below {format_size(max(total_ram - need + arena, 1 << 20))}",
            details=details,
        )
    if cg.error:
        return unknown(f"cannot read the memory cgroup of {who} ({cg.error})", ev, details=details)
    where = f"cgroup v{cg.version} {cg.path or '/'}"
    if cg.limit is None:
        summary = f"no memory limit ({where}, {who}); the daemon needs {format_size(need)}"
        status = Status.OK
        if cg.high is not None and cg.high < need:
            return warn(
                f"memory.high {format_size(cg.high)} on {who} is below the {format_size(need)} the daemon "
                "needs: the kernel throttles and reclaims it once the arena fills",
                ev,
                fix=f"raise memory.high ({cg.high_file}) to at least {format_size(need)}",
                details=details,
            )
        return CheckResult(status, summary, ev, details=details)
    limit_text = f"{format_size(cg.limit)} ({cg.limit_file})"
    if cg.limit < arena:
        return fail(
            f"the memory limit of {who} is {limit_text}, below the arena ({format_size(arena)}): the kernel "
            "kills the daemon (OOM) once the arena fills, under load",
            ev,
            fix=f"{fix_size}, or lower --max-bytes to {format_size(max(cg.limit - (need - arena), 1 << 20))}",
            details=details,
        )
    if cg.limit < need:
        return warn(
            f"the memory limit of {who} is {limit_text}: the arena fits, the daemon's own "
            f"{format_size(need - arena)} on top of it may not",
            ev,
            fix=fix_size,
            details=details,
        )
    return ok(
        f"memory limit {limit_text} covers the {format_size(need)} the daemon needs", ev, details=details
    )
