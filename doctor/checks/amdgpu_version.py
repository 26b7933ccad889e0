"""Driver minimum for AIS: amdgpu >= 6.16.6 from amdgpu-dkms >= 30.20.1.

The module string alone cannot prove the package: 30.20.0 and 30.20.1 both report 6.16.6. The
DKMS build number (or the package version, or the 4-field 31.40+ module string) decides.
"""

from __future__ import annotations

from infera.doctor.checks import container_reason, needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts.amd import dkms_info, installed_driver, loaded_driver
from infera.doctor.facts.versions import (
    AIS_MIN_BUILD,
    AIS_MIN_MODULE,
    AIS_MIN_PACKAGE,
    package_for_build,
    vstr,
)
from infera.doctor.model import CheckResult, Evidence, fail, ok, unknown
from infera.doctor.registry import check

MIN = f"amdgpu {vstr(AIS_MIN_MODULE)} from amdgpu-dkms {vstr(AIS_MIN_PACKAGE)}"
FIX = (
    f"install amdgpu-dkms {vstr(AIS_MIN_PACKAGE)} or newer (ROCm 7.2 or newer ships it), then reboot "
    "so it is the module that runs"
)


@check("amdgpu-version", "Driver minimum for AIS", "amd", order=20, needs=needs_amd_gpu)
def amdgpu_version(ctx: Context) -> CheckResult:
    loaded = loaded_driver(ctx)
    ev = list(loaded.evidence)
    if not loaded.loaded:
        return unknown("amdgpu is not loaded (see amdgpu-loaded)", ev)
    if loaded.version is None:
        return fail(f"the in-kernel amdgpu is running; AIS needs {MIN}", ev, fix=FIX)
    v = loaded.version
    if v.package is not None:
        ev.append(Evidence("module version", f"{v.raw} encodes driver package {vstr(v.package)}", "note"))
        if v.package >= AIS_MIN_PACKAGE:
            return ok(f"amdgpu {v.raw} (driver {vstr(v.package)}) meets {MIN}", ev)
        return fail(f"amdgpu {v.raw} is driver {vstr(v.package)}; AIS needs {MIN}", ev, fix=FIX)
    if v.module < AIS_MIN_MODULE:
        return fail(f"amdgpu {v.raw} is older than {vstr(AIS_MIN_MODULE)}; AIS needs {MIN}", ev, fix=FIX)

    # Which build is running? Only knowable when the running module is the installed DKMS one.
    build: int | None = None
    source = ""
    reason = container_reason(ctx)
    inst = installed_driver(ctx)
    dk = dkms_info(ctx)
    if not reason:
        ev.extend(dk.evidence)
    same = (
        not reason
        and inst.version is not None
        and inst.version.raw == v.raw
        and (not loaded.srcversion or not inst.srcversion or loaded.srcversion == inst.srcversion)
    )
    entry = dk.for_kernel(ctx.host.kernel_release())
    if same and entry and entry.build:
        build, source = entry.build, f"DKMS build {entry.version}"
    elif same and dk.package and dk.package.build:
        build, source = dk.package.build, f"package amdgpu-dkms {dk.package.raw}"
    pkg = package_for_build(build)
    label = f"{source}{f' = driver {pkg}' if pkg else ''}"
    if v.module > AIS_MIN_MODULE:
        extra = f", {label}" if build else ""
        return ok(f"amdgpu {v.raw}{extra} meets {MIN}", ev)
    if build is None:
        if reason:
            why = f"DKMS cannot be read from inside a container ({reason})"
        else:
            why = "the running module's DKMS build could not be read" + (
                f" ({dk.error})" if dk.error else " (it may not be the installed one: see amdgpu-loaded)"
            )
        return unknown(
            f"amdgpu {v.raw} is reported by both amdgpu-dkms 30.20.0 and 30.20.1; {why}",
            ev,
            fix="run `dkms status amdgpu` on the host: build 2255209 or newer is 30.20.1",
        )
    if build >= AIS_MIN_BUILD:
        return ok(f"amdgpu {v.raw}, {label} meets {MIN}", ev)
    return fail(f"amdgpu {v.raw} but {label} is older than {vstr(AIS_MIN_PACKAGE)}", ev, fix=FIX)
