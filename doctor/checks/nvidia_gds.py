"""NVIDIA GPUDirect Storage: the cuFile analog of AIS, so one command serves both vendors."""

from __future__ import annotations

from infera.doctor.checks import needs_nvidia_gpu
from infera.doctor.context import Context
from infera.doctor.facts.nvidia import (
    CUFILE_JSON,
    GDSCHECK_PATHS,
    NVFS_STATS,
    parse_cufile_json,
    parse_gdscheck,
    parse_nvfs_stats,
    truthy,
)
from infera.doctor.facts.pci import inventory
from infera.doctor.model import CheckResult, Evidence, Status, worst
from infera.doctor.registry import check


@check(
    "nvidia-gds", "GPUDirect Storage (cuFile, nvidia-fs, KvikIO)", "nvidia", order=10, needs=needs_nvidia_gpu
)
def nvidia_gds(ctx: Context) -> CheckResult:
    h = ctx.host
    inv = inventory(ctx)
    ev: list[Evidence] = []
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    drv = h.text("/proc/driver/nvidia/version")
    if drv:
        ev.append(Evidence(h.display("/proc/driver/nvidia/version"), drv.splitlines()[0].strip()))

    cufile_path = ctx.environ.get("CUFILE_ENV_PATH_JSON") or CUFILE_JSON
    props: dict[str, object] = {}
    raw = h.read(cufile_path)
    if raw.text is not None:
        try:
            props = dict(parse_cufile_json(raw.text).get("properties", {}) or {})  # type: ignore[call-overload]
        except ValueError as exc:
            findings.append((Status.WARN, f"{cufile_path} is not valid JSON ({exc})"))
        shown = {
            k: props[k] for k in ("use_compat_mode", "force_compat_mode", "use_pci_p2pdma") if k in props
        }
        ev.append(
            Evidence(h.display(cufile_path), ", ".join(f"{k}={v}" for k, v in shown.items()) or "(defaults)")
        )
    else:
        ev.append(Evidence(h.display(cufile_path), raw.error or ""))
    p2pdma_mode = props.get("use_pci_p2pdma") is True
    if props.get("force_compat_mode") is True:
        findings.append(
            (Status.FAIL, "cufile.json forces compatibility mode: every cuFile read goes through POSIX")
        )
        fixes.append(f'set "force_compat_mode": false in {cufile_path}')

    nvfs_loaded = h.is_dir("/sys/module/nvidia_fs")
    stats = h.text(NVFS_STATS)
    ev.append(Evidence(h.display("/sys/module/nvidia_fs"), "loaded" if nvfs_loaded else "not loaded"))
    summary_bits: list[str] = []
    if stats:
        st = parse_nvfs_stats(stats)
        ops = ", ".join(f"{k}={v}" for k, v in st.ops.items())
        ev.append(Evidence(h.display(NVFS_STATS), f"driver {st.driver}, GDS {st.version}, Ops {ops or '?'}"))
        summary_bits.append(f"nvidia-fs {st.driver or '?'} loaded")
        if st.ops and not any(st.ops.values()):
            summary_bits.append("no direct I/O counted yet")
        elif st.ops:
            summary_bits.append(f"direct I/O counted ({ops})")
    elif not nvfs_loaded and not p2pdma_mode:
        findings.append(
            (
                Status.WARN,
                "nvidia-fs is not loaded and cuFile is not in P2PDMA mode: GPU-direct would run in compat mode",
            )
        )
        fixes.append(
            "load nvidia-fs (`sudo modprobe nvidia-fs`, from the nvidia-gds package) or configure P2PDMA mode"
        )
    elif p2pdma_mode:
        summary_bits.append("cuFile in NVMe P2PDMA mode (nvidia-fs not used)")

    res = ctx.runner.run(["gdscheck", "-p"], also=GDSCHECK_PATHS, timeout=30)
    if res.ran:
        g = parse_gdscheck(res.stdout)
        ev.append(
            Evidence(
                res.line,
                f"release {g.release}, verification {'succeeded' if g.verified else g.verified}",
                "command",
            )
        )
        for k, v in g.drivers.items():
            if k.strip("-").startswith(("NVMe", "NFS")):
                ev.append(Evidence(res.line, f"{k} : {v}", "command"))
        if g.verified is False:
            findings.append((Status.WARN, "gdscheck -p did not report 'Platform verification succeeded'"))
            fixes.append("read `gdscheck -p` in full for the failing item")
        elif g.verified:
            summary_bits.append("gdscheck: platform verification succeeded")
        if g.properties.get("properties.use_compat_mode") == "true":
            summary_bits.append(
                "compat fallback allowed (use_compat_mode true): counters prove the direct path"
            )
    else:
        ev.append(Evidence(res.line, res.error or "", "command"))

    kvik = ctx.environ.get("KVIKIO_COMPAT_MODE")
    if kvik is not None:
        ev.append(Evidence("env KVIKIO_COMPAT_MODE", kvik, "env"))
        if truthy(kvik) is True:
            findings.append(
                (Status.WARN, "KVIKIO_COMPAT_MODE=ON: KvikIO reads through POSIX and never loads cuFile")
            )
            fixes.append("unset KVIKIO_COMPAT_MODE (AUTO) for GPU-direct")
    status = worst((s for s, _ in findings), Status.OK)
    problems = [t for s, t in findings if s is not Status.OK]
    summary = f"{len(inv.nvidia)} NVIDIA GPUs; " + "; ".join(problems + summary_bits or ["GDS state unknown"])
    return CheckResult(status, summary, ev, fix="; ".join(dict.fromkeys(fixes)) or None)
