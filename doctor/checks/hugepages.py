"""Huge pages and the arena.

The arena is a plain memfd: it never asks for hugetlbfs pages (no ``MFD_HUGETLB``). Two things
still matter. Pages reserved for hugetlbfs (``vm.nr_hugepages``) are taken out of ordinary memory,
and the arena cannot use them: a host that reserves most of its RAM as huge pages has no room
left for a large arena. And shmem transparent huge pages (``shmem_enabled``) decide whether the
arena is backed by 2 MiB pages where it can be (``always``, ``within_size``, ``advise`` when the
daemon asks, ``force``) or by 4 KiB ones (``never``, ``deny``): a performance note, not a fault.
"""

from __future__ import annotations

import re

from infera.doctor.checks.cgroup_memory import needed
from infera.doctor.context import Context
from infera.doctor.facts.memory import meminfo
from infera.doctor.model import CheckResult, Evidence, fail, ok, unknown, warn
from infera.doctor.registry import check
from infera.units import format_size

THP = "/sys/kernel/mm/transparent_hugepage"


def _selected(text: str | None) -> str | None:
    m = re.search(r"\[(\w[\w-]*)\]", text or "")
    return m.group(1) if m else None


@check("hugepages", "huge pages vs the arena", "memory", order=40)
def hugepages(ctx: Context) -> CheckResult:
    h = ctx.host
    mem = meminfo(ctx)
    arena, need, _parts = needed(ctx)
    if mem is None or "MemTotal" not in mem:
        return unknown(f"cannot read /proc/meminfo ({h.read('/proc/meminfo').error})")
    total = mem["MemTotal"]
    pages, page = mem.get("HugePages_Total", 0), mem.get("Hugepagesize", 2 << 20)
    reserved = mem.get("Hugetlb", pages * page)
    ev = [
        Evidence(
            h.display("/proc/meminfo"),
            f"MemTotal {format_size(total)}, HugePages_Total {pages} x {format_size(page)}, "
            f"HugePages_Free {mem.get('HugePages_Free', 0)}, Hugetlb {format_size(reserved)}",
        )
    ]
    shmem = _selected(h.text(f"{THP}/shmem_enabled"))
    if shmem:
        ev.append(Evidence(h.display(f"{THP}/shmem_enabled"), shmem))
    thp = (
        ""
        if shmem is None
        else (
            f"; shmem THP {shmem}: the arena gets "
            + ("2 MiB pages where it can" if shmem in ("always", "within_size", "force") else "4 KiB pages")
        )
    )
    left = total - reserved
    if reserved and left < arena:
        return fail(
            f"{format_size(reserved)} of {format_size(total)} are reserved as huge pages, which the arena (a plain "
            f"memfd) cannot use: {format_size(left)} is left for an arena of {format_size(arena)}",
            ev,
            fix="free the reservation (sysctl vm.nr_hugepages=0, or fewer) or lower --max-bytes",
        )
    if reserved and left < need:
        return warn(
            f"{format_size(reserved)} reserved as huge pages leaves {format_size(left)}, tight for the "
            f"{format_size(need)} the daemon needs (the arena cannot use huge pages)",
            ev,
            fix="lower vm.nr_hugepages, or --max-bytes",
        )
    note = (
        f"{format_size(reserved)} reserved as huge pages, {format_size(left)} left"
        if reserved
        else "no huge pages reserved"
    )
    return ok(f"the arena does not ask for hugetlb pages; {note}{thp}", ev)
