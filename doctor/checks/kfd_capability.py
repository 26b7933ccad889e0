"""KFD capability bit 0x40: shown for information, never used to decide anything.

The bit is upstream's HSA_CAP_VA_LIMIT, temporarily reused by AMD's driver to advertise "AIS is
initialised"; GPUs that log ``AIS: registered`` have been seen with it clear. ais-check reads it
only on DKMS builds above 2327936, which is why its P2PDMA line can be False on a working host.
"""

from __future__ import annotations

from infera.doctor.checks import container_reason, needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts.amd import dkms_info
from infera.doctor.facts.pci import KFD_NODES, kfd_nodes
from infera.doctor.facts.versions import KFD_BIT_MIN_BUILD
from infera.doctor.model import CheckResult, Evidence, ok, unknown
from infera.doctor.registry import check

BIT = 0x40
WHY = (
    "information only: 0x40 is HSA_CAP_VA_LIMIT, reused for now to mean 'AIS initialised', and it has "
    "been seen clear on GPUs that registered AIS; the doctor trusts dmesg-ais and ais-check's amdgpu line"
)


@check("kfd-capability", "KFD capability bit 0x40 (information)", "amd", order=50, needs=needs_amd_gpu)
def kfd_capability(ctx: Context) -> CheckResult:
    nodes = kfd_nodes(ctx)
    if nodes is None:
        return unknown(
            f"no KFD topology at {ctx.host.display(KFD_NODES)} (amdgpu's compute part not loaded, or /sys/class/kfd "
            "not visible here)",
            [],
        )
    gpus = [n for n in nodes if n.is_gpu]
    ev = []
    for n in gpus:
        cap = n.capability
        state = "set" if cap is not None and cap & BIT else "clear"
        ev.append(
            Evidence(
                ctx.host.display(f"{KFD_NODES}/{n.node}/properties"),
                f"capability {cap} ({hex(cap) if cap is not None else '?'}): bit 0x40 {state}; {n.gfx or ''}".strip(),
            )
        )
    set_n = sum(1 for n in gpus if n.capability is not None and n.capability & BIT)
    details = [WHY]
    entry = None if container_reason(ctx) else dkms_info(ctx).for_kernel(ctx.host.kernel_release())
    if entry and entry.build and entry.build > KFD_BIT_MIN_BUILD and set_n < len(gpus):
        details.append(
            f"DKMS build {entry.build} > {KFD_BIT_MIN_BUILD}: ais-check on the host reads this bit for its "
            "Kernel P2PDMA line, so it will print False there"
        )
    return ok(f"bit 0x40 set on {set_n} of {len(gpus)} GPU nodes (information only)", ev, details=details)
