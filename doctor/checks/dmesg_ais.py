"""dmesg: one ``AIS: registered NNNNNMB device memory`` line per AMD GPU, or AIS is off.

The driver logs success at info level and every reason for skipping AIS at debug level, so a
missing line is the signal even when nothing else complains.
"""

from __future__ import annotations

import re

from infera.doctor.checks import needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts.kernel import kernel_log
from infera.doctor.facts.pci import inventory
from infera.doctor.model import CheckResult, Evidence, fail, ok, unknown, warn
from infera.doctor.registry import check

REGISTERED = re.compile(r"(?:amdgpu (\S+): )?(?:amdgpu: )?AIS: registered (\d+)MB device memory")
#: Runtime failures the driver logs while serving AIS reads.
RUNTIME_ERRORS = (
    "Invalid file path or mount point",
    "Failed to read AIS file",
    "DMA-BUF p2p not accessible",
    "AIS: P2P DMA not accessible",
    "AIS: unsupported storage type",
    "AIS: file does not support direct I/O",
    "AIS: vfs transfer failed",
    "AIS: vfs transfer stalled",
    "AIS: P2P not accessible for slave",
    "AIS: NFS P2P check",
)
WHY = (
    "the reason is logged only at debug level when amdgpu loads; see gpu, amdgpu-loaded, amdgpu-version "
    'and kernel-p2pdma, or boot once with amdgpu.dyndbg="+p" and read `dmesg | grep AIS:`'
)


@check("dmesg-ais", "Kernel log: AIS registered per GPU", "amd", order=40, needs=needs_amd_gpu)
def dmesg_ais(ctx: Context) -> CheckResult:
    gpus = inventory(ctx).amd
    log = kernel_log(ctx)
    if log.text is None:
        return unknown(
            f"cannot read the kernel log ({log.error})",
            [Evidence(log.source, log.error or "", "command")],
            fix="run as root (`sudo kvd doctor`), or read `sudo dmesg | grep AIS:` yourself",
        )
    registered: dict[str, int] = {}
    unnamed = 0
    lines: list[str] = []
    errors: list[str] = []
    for line in log.text.splitlines():
        m = REGISTERED.search(line)
        if m:
            lines.append(line.strip())
            if m.group(1):
                registered[m.group(1)] = int(m.group(2))
            else:
                unnamed += 1
        elif any(e in line for e in RUNTIME_ERRORS):
            errors.append(line.strip())
    ev = [Evidence(log.source, ln, "command") for ln in lines[-16:]]
    ev.extend(Evidence(log.source, ln, "command") for ln in errors[-8:])
    if not lines:
        ev.append(Evidence(log.source, "no 'AIS: registered' lines", "command"))
    bdfs = {g.bdf for g in gpus}
    if registered:
        missing = sorted(bdfs - set(registered))
        count = len(bdfs & set(registered))
    elif unnamed:
        count = min(unnamed, len(gpus))
        missing = [] if unnamed >= len(gpus) else [f"{len(gpus) - unnamed} GPU(s)"]
    else:
        count, missing = 0, sorted(bdfs)
    sizes = sorted(set(registered.values()))
    size_txt = f" ({', '.join(f'{s} MB' for s in sizes)})" if sizes else ""
    if not missing:
        summary = f"AIS registered on {count} of {len(gpus)} GPUs{size_txt}"
        if errors:
            return warn(
                f"{summary}, but the log has {len(errors)} AIS runtime error(s): {errors[-1][-120:]}",
                ev,
                fix="see docs/doctor/dmesg-ais.md for what each message means",
            )
        return ok(summary, ev)
    if log.wrapped:
        return unknown(
            f"AIS registered on {count} of {len(gpus)} GPUs, but the kernel log no longer reaches back to boot",
            ev,
            fix="read `journalctl -k -b | grep AIS:` (as root), or check right after the next boot",
        )
    vfs = [g.bdf for g in gpus if g.is_vf]
    hint = f"; {len(vfs)} of them SR-IOV VFs, where AIS never starts" if vfs else ""
    return fail(
        f"AIS registered on {count} of {len(gpus)} GPUs (missing: {', '.join(missing)}){hint}: "
        "AIS is off there, whatever other signals say",
        ev,
        fix=WHY,
    )
