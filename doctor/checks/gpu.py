"""GPU: AIS initialises only on large-BAR discrete GPUs that are physical functions."""

from __future__ import annotations

from collections import Counter

from infera.doctor.checks import needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts.pci import inventory
from infera.doctor.model import CheckResult, Evidence, Status, ok, worst
from infera.doctor.registry import check
from infera.units import format_size


@check("gpu", "GPU: large-BAR dGPU, not SR-IOV, not APU", "platform", order=20, needs=needs_amd_gpu)
def gpu(ctx: Context) -> CheckResult:
    inv = inventory(ctx)
    evidence: list[Evidence] = []
    problems: list[tuple[Status, str]] = []
    fixes: list[str] = []
    for g in inv.amd:
        evidence.extend(g.evidence)
        if g.is_vf:
            problems.append((Status.FAIL, f"{g.bdf} is an SR-IOV virtual function ({g.vf_reason})"))
            fixes.append(
                "GPU-direct needs a physical function: run on bare metal or pass the whole GPU through; "
                "on a VF the connector serves L3 over POSIX"
            )
        if g.is_apu:
            problems.append((Status.FAIL, f"{g.bdf} {g.name} is an APU; AIS supports discrete GPUs only"))
        if g.vram_total and g.vis_vram_total is not None:
            evidence.append(
                Evidence(
                    ctx.host.display(f"{g.sysfs}/mem_info_vis_vram_total"),
                    f"{g.vis_vram_total} of mem_info_vram_total {g.vram_total}",
                )
            )
            if g.vis_vram_total < g.vram_total:
                problems.append(
                    (
                        Status.FAIL,
                        f"{g.bdf} small BAR: {format_size(g.vis_vram_total)} of {format_size(g.vram_total)} "
                        "VRAM is CPU-visible",
                    )
                )
                fixes.append(
                    "enable Above 4G Decoding and Resizable BAR in the firmware so all VRAM is visible"
                )
        elif g.bar0_size and g.vram_total:
            evidence.append(Evidence(ctx.host.display(f"{g.sysfs}/resource"), f"BAR0 {g.bar0_size} bytes"))
            if g.bar0_size < g.vram_total:
                problems.append((Status.FAIL, f"{g.bdf} small BAR: BAR0 {format_size(g.bar0_size)}"))
        else:
            problems.append(
                (Status.UNKNOWN, f"{g.bdf}: visible VRAM unknown (no mem_info_* files: amdgpu not bound?)")
            )
        if g.driver != "amdgpu":
            what = f"bound to {g.driver}" if g.driver else "not bound to any driver"
            problems.append((Status.WARN, f"{g.bdf} is {what}"))
            fixes.append("load amdgpu (`sudo modprobe amdgpu`) and check `dmesg` for why it did not bind")
    names = Counter(g.name for g in inv.amd)
    label = ", ".join(f"{n}x {name}" for name, n in names.items())
    if not problems:
        vis = {format_size(g.vis_vram_total) for g in inv.amd if g.vis_vram_total}
        return ok(
            f"{label}: physical functions, large BAR ({', '.join(sorted(vis)) or 'full VRAM'} visible)",
            evidence,
        )
    text = "; ".join(p for _, p in problems)
    fix = "; ".join(dict.fromkeys(fixes)) or None
    return CheckResult(worst(s for s, _ in problems), f"{label}: {text}", evidence, fix=fix)
