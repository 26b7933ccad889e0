"""Kernel built with CONFIG_PCI_P2PDMA=y, judged on what the running kernel itself exposes."""

from __future__ import annotations

from infera.doctor.checks import container_reason
from infera.doctor.context import Context
from infera.doctor.facts.kernel import P2PDMA_SYMBOLS, config_option, kallsyms
from infera.doctor.facts.pci import inventory
from infera.doctor.model import CheckResult, Evidence, Status, fail, ok, skip, unknown, warn
from infera.doctor.registry import check

OPTION = "CONFIG_PCI_P2PDMA"
FIX = (
    "boot a kernel built with CONFIG_PCI_P2PDMA=y (on Ubuntu 22.04 the HWE 6.8 kernel has it, "
    "the 5.15 GA kernel does not)"
)


@check("kernel-p2pdma", "Kernel CONFIG_PCI_P2PDMA", "platform", order=30)
def kernel_p2pdma(ctx: Context) -> CheckResult:
    rel = ctx.host.kernel_release()
    evidence = [Evidence(ctx.host.display("/proc/sys/kernel/osrelease"), rel or "unknown")]
    verdict: str | None = None
    basis = ""
    for cv in config_option(ctx, OPTION):
        if cv.value is None:
            evidence.append(Evidence(cv.source, cv.error or "unreadable"))
            continue
        evidence.append(
            Evidence(cv.source, f"{OPTION}={cv.value}" if cv.value != "n" else f"{OPTION} is not set")
        )
        if verdict is None and cv.kernel_provided:
            verdict, basis = cv.value, cv.source
    ks = kallsyms(ctx)
    if ks.readable:
        present = [s for s in P2PDMA_SYMBOLS if s in ks.found]
        evidence.append(Evidence(ks.source, f"P2PDMA symbols: {', '.join(present) or 'none'}"))
        if present and verdict is None:
            verdict, basis = "y", f"{ks.source}: {present[0]} present"
    else:
        evidence.append(Evidence(ks.source, ks.error or "unreadable"))
    if verdict is None:
        host_files = [
            cv for cv in config_option(ctx, OPTION) if cv.value is not None and not cv.kernel_provided
        ]
        reason = container_reason(ctx)
        if host_files and reason is None:
            verdict, basis = host_files[0].value, host_files[0].source
        elif host_files:
            return unknown(
                f"only {host_files[0].source} answers, and inside a container ({reason}) that file "
                "says how a kernel was built, not what runs",
                evidence,
                fix="check on the host: `grep p2pdma_pgmap_ops /proc/kallsyms` or run `kvd doctor` there",
            )
    inv = inventory(ctx)
    if verdict is None:
        status = Status.SKIP if not inv.any and not inv.error else Status.UNKNOWN
        return CheckResult(
            status,
            "no kernel config source readable (/proc/config.gz, /boot/config-*, /proc/kallsyms)",
            evidence,
            fix=None if status is Status.SKIP else "run `kvd doctor` as root on the host",
        )
    if verdict == "y":
        return ok(f"{OPTION}=y (from {basis})", evidence)
    text = f"{OPTION} is {'=' + verdict if verdict != 'n' else 'not set'} (from {basis})"
    if inv.amd:
        return fail(f"{text}: AIS cannot work on this kernel", evidence, fix=FIX)
    if inv.nvidia:
        return warn(f"{text}: GDS can only use its nvidia-fs mode, not NVMe P2PDMA", evidence, fix=FIX)
    return skip(f"no GPU here; {text} (it only matters for GPU-direct)", evidence)
