"""``RLIMIT_MEMLOCK`` against the memory the configured paths register.

RDMA registration (``ibv_reg_mr``) pins pages against the process's locked-memory limit unless it
has ``CAP_IPC_LOCK``. With ``--long-backend mooncake --mooncake-protocol rdma`` the daemon
registers its whole arena with Mooncake, plus the segment it lends and its transfer buffer; a
container's default limit (often 64 KiB or 8 MiB) makes that fail at start or at the first
transfer. RDMA NICs on the host (``/sys/class/infiniband``) mean other RDMA users on the engines'
side (Mooncake or NIXL P/D transfer, NCCL over InfiniBand) face the same limit.
"""

from __future__ import annotations

from infera.doctor.context import Context
from infera.doctor.facts.kvdconf import settings
from infera.doctor.facts.procs import CAP_IPC_LOCK, has_capability, limits
from infera.doctor.model import CheckResult, Evidence, fail, ok, skip, unknown, warn
from infera.doctor.registry import check
from infera.units import format_size

RESOURCE = "Max locked memory"
#: Below this an RDMA user on the engines' side is likely to fail (8 MiB is a common default).
SMALL = 64 << 20


def _fmt(n: int | None) -> str:
    return "unlimited" if n is None else format_size(n)


@check("memlock", "locked-memory limit vs RDMA registration", "memory", order=30)
def memlock(ctx: Context) -> CheckResult:
    h = ctx.host
    s = settings(ctx)
    pid: int | str = s.pid if s.pid is not None else "self"
    who = s.process.label if s.process else "kvd doctor (no kvd daemon running)"
    lim = limits(ctx, pid)
    cap = has_capability(ctx, pid, CAP_IPC_LOCK)
    ev: list[Evidence] = []
    needs: list[tuple[str, int]] = []
    rdma = s.get("long_backend") == "mooncake" and s.get("mooncake_protocol") == "rdma"
    if rdma:
        arena = int(s.get("max_bytes") or 0)
        seg, buf = int(s.get("mooncake_segment_bytes") or 0), int(s.get("mooncake_buffer_bytes") or 0)
        needs.append(
            (
                f"the daemon registers the arena ({format_size(arena)}), segment and buffer with Mooncake RDMA",
                arena + seg + buf,
            )
        )
        ev.append(
            Evidence("daemon settings", f"{s.shown('long_backend')}, {s.shown('mooncake_protocol')}", "note")
        )
    nics = h.listdir("/sys/class/infiniband")
    if nics:
        ev.append(Evidence(h.display("/sys/class/infiniband"), ", ".join(nics)))
    if lim is None:
        ev.append(
            Evidence(h.display(f"/proc/{pid}/limits"), h.read(f"/proc/{pid}/limits").error or "unreadable")
        )
        if needs:
            return unknown(
                f"cannot read the locked-memory limit of {who} ({h.read(f'/proc/{pid}/limits').error})", ev
            )
        return skip(
            "no configured path registers memory against RLIMIT_MEMLOCK (and the limit is not readable here)",
            ev,
        )
    ml = lim.get(RESOURCE)
    if ml is None:
        return unknown(f"/proc/{pid}/limits has no {RESOURCE!r} line", ev)
    ev.append(
        Evidence(
            h.display(f"/proc/{pid}/limits"),
            f"{RESOURCE}: soft {_fmt(ml.soft)}, hard {_fmt(ml.hard)} ({who})",
        )
    )
    if cap is not None:
        ev.append(
            Evidence(h.display(f"/proc/{pid}/status"), f"CAP_IPC_LOCK {'in' if cap else 'not in'} CapEff")
        )
    exempt = ml.soft is None or cap is True
    if not needs:
        if nics and not exempt and ml.soft is not None and ml.soft < SMALL:
            return warn(
                f"RDMA NICs ({', '.join(nics)}) but a locked-memory limit of {_fmt(ml.soft)}: RDMA transfers on the "
                "engines' side (Mooncake or NIXL P/D, NCCL over InfiniBand) register memory against it",
                ev,
                fix="raise the limit for the engines (docker run --ulimit memlock=-1; systemd LimitMEMLOCK=infinity)",
            )
        return ok(
            f"locked-memory limit {_fmt(ml.soft)}; no configured kvd path registers memory against it "
            "(the arena is a memfd; the GPU copy path pins it through the GPU driver)",
            ev,
        )
    what, need = max(needs, key=lambda x: x[1])
    if exempt or ml.soft is None:
        why = "unlimited" if ml.soft is None else "CAP_IPC_LOCK"
        return ok(f"{what}: {format_size(need)}, and the limit is {why}", ev)
    if ml.soft < need:
        raise_to = "-1" if ml.hard is None or ml.hard >= need else str(need)
        return fail(
            f"{what}: {format_size(need)}, but {who} may lock only {_fmt(ml.soft)}: registration fails",
            ev,
            fix=f"raise RLIMIT_MEMLOCK for the daemon (docker run --ulimit memlock={raise_to}; systemd LimitMEMLOCK=infinity; "
            "ulimit -l unlimited before starting it), or give it CAP_IPC_LOCK",
        )
    return ok(f"{what}: {format_size(need)}, within the limit {_fmt(ml.soft)}", ev)
