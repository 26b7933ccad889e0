"""One module per check. Every module here is imported by the registry, so a new check is a new file.

Helpers shared by several checks live in this ``__init__`` (the registry does not treat it as a
check module).
"""

from __future__ import annotations

from infera.doctor.context import Context
from infera.doctor.facts.container import detect
from infera.doctor.facts.pci import inventory
from infera.doctor.model import CheckResult, Evidence, skip, unknown


def needs_amd_gpu(ctx: Context) -> CheckResult | None:
    """A skip (or unknown) result when there is no AMD GPU to check, else None."""
    inv = inventory(ctx)
    if inv.error:
        return unknown(
            f"cannot list GPUs: {inv.describe()}",
            [Evidence(ctx.host.display("/sys/bus/pci/devices"), inv.error)],
        )
    if inv.amd:
        return None
    if inv.nvidia:
        return skip(f"no AMD GPU ({len(inv.nvidia)} NVIDIA GPUs: see the nvidia-gds check)")
    return skip(f"no AMD GPU here ({inv.describe()})")


def needs_nvidia_gpu(ctx: Context) -> CheckResult | None:
    """A skip result when there is no NVIDIA GPU (nor NVIDIA driver) to check (unknown when the
    GPUs cannot be listed), else None."""
    inv = inventory(ctx)
    if not inv.nvidia and not ctx.host.exists("/proc/driver/nvidia/version"):
        if inv.error:
            return unknown(
                f"cannot list GPUs: {inv.describe()}",
                [Evidence(ctx.host.display("/sys/bus/pci/devices"), inv.error)],
            )
        return skip(f"no NVIDIA GPU here ({inv.describe()})")
    return None


def process_evidence(pid: int, *facts: str) -> Evidence:
    """Evidence about the engine process ``pid``: its non-empty ``facts``, comma-separated."""
    return Evidence(f"process {pid}", ", ".join(f for f in facts if f), "process")


def container_reason(ctx: Context) -> str | None:
    """Why host-only files cannot be trusted here, or None on a host."""
    info = detect(ctx)
    return info.describe() if info.in_container else None


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 namespace``, ``2 namespaces``."""
    return f"{n} {word if n == 1 else many or word + 's'}"
