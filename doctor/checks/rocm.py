"""ROCm >= 7.2 and a HIP runtime where the engine runs.

The engine uses the HIP runtime of its own image; the host needs the kernel driver for AIS and
ROCm for ais-check. So an old or missing ROCm fails inside a container (that is the engine's
runtime) and warns on a host (check the image too).
"""

from __future__ import annotations

from infera.doctor.checks import container_reason, needs_amd_gpu
from infera.doctor.context import Context
from infera.doctor.facts.versions import ROCM_MIN, parse_rocm_version, vstr
from infera.doctor.model import CheckResult, Evidence, fail, ok, warn
from infera.doctor.registry import check

LIB_DIRS = ("lib", "lib64")


def _rocm_dirs(ctx: Context) -> list[str]:
    h = ctx.host
    out = []
    env = ctx.environ.get("ROCM_PATH")
    if env:
        out.append(env.rstrip("/"))
    out.append("/opt/rocm")
    for name in h.listdir("/opt"):
        if name.startswith("rocm-"):
            out.append(f"/opt/{name}")
    for name in h.listdir("/opt/rocm"):
        if name.startswith("core-"):
            out.append(f"/opt/rocm/{name}")
    return list(dict.fromkeys(out))


@check("rocm", "ROCm >= 7.2 and HIP runtime", "amd", order=60, needs=needs_amd_gpu)
def rocm(ctx: Context) -> CheckResult:
    h = ctx.host
    ev: list[Evidence] = []
    versions: list[tuple[str, tuple[int, ...]]] = []
    libs: list[str] = []
    for d in _rocm_dirs(ctx):
        r = h.read(f"{d}/.info/version")
        if r.text is not None:
            v = parse_rocm_version(r.text)
            ev.append(Evidence(h.display(f"{d}/.info/version"), r.text.strip()))
            if v:
                versions.append((d, v))
        for sub in LIB_DIRS:
            for name in h.listdir(f"{d}/{sub}"):
                if name.startswith("libamdhip64.so"):
                    libs.append(f"{d}/{sub}/{name}")
    if libs:
        ev.append(Evidence("HIP runtime", ", ".join(libs[:4])))
    reason = container_reason(ctx)
    where = "in this container image" if reason else "on the host"
    fix_where = (
        "install ROCm 7.2 or newer in the engine image"
        if reason
        else "install ROCm 7.2 or newer on the host (and check the engine image: `cat /opt/rocm/.info/version` in it)"
    )
    bad = fail if reason else warn
    if not versions:
        return bad(f"no ROCm found {where} (/opt/rocm/.info/version missing)", ev, fix=fix_where)
    best_dir, best = max(versions, key=lambda x: x[1])
    if best[:2] < ROCM_MIN:
        return bad(
            f"ROCm {vstr(best)} at {best_dir} {where} is older than {vstr(ROCM_MIN)} "
            "(a 7.1 runtime reports HIP runtime : False in ais-check)",
            ev,
            fix=fix_where,
        )
    if not libs:
        return bad(f"ROCm {vstr(best)} {where} but no libamdhip64.so (HIP runtime) found", ev, fix=fix_where)
    note = "" if reason else "; the engine image needs 7.2+ too"
    return ok(f"ROCm {vstr(best)} at {best_dir} with HIP runtime {where}{note}", ev)
