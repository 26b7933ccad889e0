"""Container detection: where the doctor runs decides which answers it can trust."""

from __future__ import annotations

from infera.doctor.context import Context
from infera.doctor.facts.container import detect
from infera.doctor.model import CheckResult, ok, unknown, warn
from infera.doctor.registry import check


@check("container", "Container detection", "platform", order=10)
def container(ctx: Context) -> CheckResult:
    info = detect(ctx)
    details = []
    if info.vm:
        details.append("also a virtual machine: " + ", ".join(f"{s.name} ({s.value})" for s in info.vm))
    if not info.in_container and not info.looked_at:
        return unknown(
            "cannot tell: none of /proc/1/cgroup, /proc/1/environ, /proc/1/cmdline or "
            f"/proc/self/mountinfo is readable under {ctx.host.root}",
            info.evidence(),
            details=details,
        )
    if not info.in_container:
        where = "a virtual machine" if info.vm else "the host"
        return ok(f"not in a container: running on {where}", info.evidence(), details=details)
    names = "; ".join(f"{s.name}" for s in info.signals)
    rt = f" ({info.runtime})" if info.runtime else ""
    if info.strong:
        summary = f"running inside a container{rt}: {names}"
    else:
        summary = f"possibly inside a container{rt}: only weak signals ({names})"
    details.append(
        "host-only checks (installed driver, DKMS, /boot kernel config, host ROCm) report unknown here; "
        "kernel-provided facts (/sys, /proc/kallsyms, /proc/config.gz, the kernel log) still count"
    )
    return warn(
        summary,
        info.evidence(),
        fix="run `kvd doctor` (and /opt/rocm/bin/ais-check) on the host too; what a container sees of "
        "/lib/modules, DKMS and /boot belongs to the image, not the host",
        details=details,
    )
