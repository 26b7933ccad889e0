"""amdgpu loaded vs installed: a DKMS upgrade does nothing until the new module is loaded."""

from __future__ import annotations

from infera.doctor.checks import container_reason, needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts.amd import dkms_info, installed_driver, loaded_driver
from infera.doctor.facts.pci import inventory
from infera.doctor.model import CheckResult, fail, ok, unknown
from infera.doctor.registry import check

REBOOT = (
    "reboot so the installed amdgpu is the one running (AIS stays off until then), then rerun `kvd doctor`"
)


@check("amdgpu-loaded", "amdgpu loaded vs installed", "amd", order=10)
def amdgpu_loaded(ctx: Context) -> CheckResult:
    loaded = loaded_driver(ctx)
    if not loaded.loaded:
        early = needs_amd_gpu(ctx)
        if early is not None:
            return early
        n = len(inventory(ctx).amd)
        return fail(
            f"amdgpu is not loaded, but there are {n} AMD GPUs",
            loaded.evidence,
            fix="load it (`sudo modprobe amdgpu`) and read `sudo dmesg | grep -i amdgpu` for why it did not",
        )
    ev = list(loaded.evidence)
    running = f"amdgpu {loaded.version.raw}" if loaded.version else "the in-kernel amdgpu (no version)"
    reason = container_reason(ctx)
    if reason:
        return unknown(
            f"loaded: {running}; what is installed on the host cannot be read from inside a container ({reason})",
            ev,
            fix="run `kvd doctor` on the host to compare it with the installed driver",
        )
    inst = installed_driver(ctx)
    ev.extend(inst.evidence)
    dk = dkms_info(ctx)
    ev.extend(dk.evidence)
    if inst.error:
        return unknown(
            f"loaded: {running}; installed driver unknown ({inst.error})", ev, fix="install kmod (modinfo)"
        )
    installed = f"amdgpu {inst.version.raw}" if inst.version else "the in-kernel amdgpu"
    where = f" ({inst.filename})" if inst.filename else ""
    if loaded.in_kernel:
        if inst.is_dkms or inst.version is not None:
            return fail(
                f"reboot needed: the in-kernel amdgpu is running but {installed}{where} is installed",
                ev,
                fix=REBOOT,
            )
        return ok("the in-kernel amdgpu is loaded and no DKMS amdgpu is installed (see amdgpu-version)", ev)
    assert loaded.version is not None
    if inst.version is None:
        return fail(
            f"loaded {running} but the module on disk{where} is the in-kernel one: the DKMS build is gone",
            ev,
            fix="reinstall amdgpu-dkms for this kernel (`sudo dkms status amdgpu`), then reboot",
        )
    if loaded.version.raw != inst.version.raw:
        return fail(f"reboot needed: loaded {running}, installed {installed}{where}", ev, fix=REBOOT)
    if loaded.srcversion and inst.srcversion and loaded.srcversion != inst.srcversion:
        return fail(
            f"reboot needed: both say {loaded.version.raw} but they are different builds "
            f"(srcversion loaded {loaded.srcversion}, on disk {inst.srcversion})",
            ev,
            fix=REBOOT,
        )
    entry = dk.for_kernel(ctx.host.kernel_release())
    if entry and entry.module_version and entry.module_version[:3] != loaded.version.module:
        return fail(
            f"reboot needed: loaded {running}, DKMS has {entry.version} for {entry.kernel}",
            ev,
            fix=REBOOT,
        )
    same = "srcversion matches" if loaded.srcversion and inst.srcversion else "versions match"
    return ok(f"loaded {running} is the installed one ({same})", ev)
