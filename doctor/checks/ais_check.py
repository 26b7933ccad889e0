"""ais-check: run AMD's own checker and read it the way its lines deserve.

Its ``amdgpu`` line (the loaded driver has the AIS entry point) is the one to trust. Its
``Kernel P2PDMA support`` line is, depending on the DKMS build, either the KFD capability bit
(a known false negative) or a grep of kernel config files, which inside a container is whatever
``/boot`` holds. The doctor never suggests mounting ``/boot`` into a container: that only feeds
the weak fallback.
"""

from __future__ import annotations

from infera.doctor.checks import container_reason, needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts import aischeck
from infera.doctor.facts.amd import dkms_info
from infera.doctor.facts.kernel import AIS_SYMBOL, kallsyms
from infera.doctor.facts.versions import KFD_BIT_MIN_BUILD
from infera.doctor.model import CheckResult, Evidence, Status, fail, ok, unknown, worst
from infera.doctor.registry import check

HOST_FIX = "run /opt/rocm/bin/ais-check as root on the host (not in the container) and trust its amdgpu line"


@check("ais-check", "ais-check (AMD's AIS checker)", "amd", order=30, needs=needs_amd_gpu)
def ais_check(ctx: Context) -> CheckResult:
    run = aischeck.run(ctx)
    res = run.result
    ev = [Evidence(res.line, res.error or f"exit {res.returncode}", "command")]
    if res.missing or run.output is None:
        return _without_ais_check(ctx, ev, res.error or "did not run")
    out = run.output
    for name, val in out.components.items():
        ev.append(Evidence(res.line, f"{name} : {val}", "command"))
    for v in out.volumes:
        ev.append(
            Evidence(
                res.line,
                f"volume {v.mountpoint} {v.fstype} {v.device} {v.backing} O_DIRECT={v.o_direct} HIPFILE={v.hipfile}",
                "command",
            )
        )
    for note in out.notes:
        ev.append(Evidence(f"{res.line} (stderr)", note, "command"))
    amd = out.get(aischeck.AMDGPU)
    if amd is None:
        return unknown(
            f"ais-check printed no amdgpu line (exit {res.returncode}); output format not recognised",
            [*ev, Evidence(res.line, (res.stdout or res.stderr).strip()[:400], "command")],
            fix="run /opt/rocm/bin/ais-check -v by hand and compare with docs/doctor/ais-check.md",
        )
    if not amd:
        return fail(
            f"ais-check: amdgpu : False (exit {res.returncode}): the loaded driver has no AIS",
            ev,
            fix="see amdgpu-loaded and amdgpu-version: usually a reboot after a DKMS upgrade, or a driver "
            "older than amdgpu-dkms 30.20.1",
        )
    reason = container_reason(ctx)
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    p2p = out.get(aischeck.KERNEL_P2PDMA)
    if reason and p2p is not None:
        how = "no kernel config file found" if out.no_kernel_config else "read from kernel config files"
        findings.append(
            (
                Status.OK,
                f"its Kernel P2PDMA line ({p2p}) is not trustworthy in a container ({how}); "
                "do not mount /boot into the container to change it",
            )
        )
    elif p2p is False:
        entry = dkms_info(ctx).for_kernel(ctx.host.kernel_release())
        if entry and entry.build and entry.build > KFD_BIT_MIN_BUILD:
            findings.append(
                (
                    Status.OK,
                    f"Kernel P2PDMA : False comes from the KFD capability bit on DKMS build {entry.build}, "
                    "a known false negative (see kfd-capability); the amdgpu line and dmesg decide",
                )
            )
        else:
            findings.append(
                (Status.WARN, "Kernel P2PDMA : False (it found no CONFIG_PCI_P2PDMA=y; see kernel-p2pdma)")
            )
            fixes.append("see kernel-p2pdma")
    if out.get(aischeck.HIP_RUNTIME) is False:
        where = "this image" if reason else "the host"
        findings.append(
            (Status.WARN, f"HIP runtime : False: no HIP with hipFile entry points in {where} (ROCm < 7.2?)")
        )
        fixes.append("install ROCm 7.2 or newer where the engine runs (see rocm)")
    if out.get(aischeck.VOLUME) is False:
        findings.append(
            (
                Status.WARN,
                "hipFile-capable volume : False (no mount it considers fast-path capable; it also says no for md)",
            )
        )
        fixes.append("check the long-tier path with `kvd doctor --check storage --long-path DIR`")
    if out.vf_warning:
        findings.append((Status.WARN, "it reports SR-IOV virtual functions (fast path off there; see gpu)"))
        fixes.append("see gpu")
    if res.returncode not in (0, None) and not any(s in (Status.WARN, Status.FAIL) for s, _ in findings):
        false = [k for k, v in out.components.items() if not v]
        if not false and not reason:
            findings.append((Status.WARN, f"exit {res.returncode} although every line it printed is True"))
    status = worst((s for s, _ in findings), Status.OK)
    summary = f"ais-check: amdgpu : True (exit {res.returncode})"
    if findings:
        summary += "; " + "; ".join(t for _, t in findings)
    fix = "; ".join(dict.fromkeys(fixes)) or (HOST_FIX if reason else None)
    return CheckResult(status, summary, ev, fix=fix if status is not Status.OK else None)


def _without_ais_check(ctx: Context, ev: list[Evidence], why: str) -> CheckResult:
    """No ais-check: read the same signal its amdgpu line uses, the AIS symbol of the loaded amdgpu."""
    ks = kallsyms(ctx)
    fix = "install hipFile's tools (ROCm 7.2+ puts ais-check in /opt/rocm/bin) to run AMD's own check"
    if not ks.readable:
        ev.append(Evidence(ks.source, ks.error or "unreadable"))
        return unknown(f"ais-check {why}, and {ks.source} is not readable either", ev, fix=fix)
    has = AIS_SYMBOL in ks.found
    ev.append(Evidence(ks.source, f"{AIS_SYMBOL} {'present' if has else 'absent'}"))
    if has:
        return ok(
            f"ais-check {why}; the loaded amdgpu has the AIS entry point ({AIS_SYMBOL}), which is what its "
            "amdgpu line checks",
            ev,
        )
    return fail(
        f"ais-check {why}; the loaded amdgpu lacks the AIS entry point ({AIS_SYMBOL}): its amdgpu line would be False",
        ev,
        fix="see amdgpu-loaded and amdgpu-version",
    )
