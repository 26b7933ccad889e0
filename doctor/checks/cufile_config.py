"""cuFile settings against what kvd's GPU-direct path needs on NVIDIA.

The trap: GPU-direct configured, ``nvidia_fs`` not loaded, ``allow_compat_mode`` true (cuFile's
default), so every "GPU-direct" read runs through POSIX and a host bounce buffer without an
error. kvd's connector reports that fallback at start; this check says it before anything runs.

GPU-direct is requested when ``INFERA_KVD_AIS`` is ``1`` (or ``auto`` with
``INFERA_KVD_HIPFILE_ROOTS`` set) here or in a running engine, or a daemon client declares a
cuFile data path. cuFile has two direct modes: nvidia-fs (the ``nvidia_fs`` module) and NVMe
P2PDMA (``use_pci_p2pdma``: no nvidia-fs, but the open kernel modules >= 565, a kernel with
``CONFIG_PCI_P2PDMA`` and NVMe without multipath).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infera.doctor.checks import needs_nvidia_gpu
from infera.doctor.context import Context
from infera.doctor.facts.daemon import daemon as daemon_view
from infera.doctor.facts.daemon import engine_clients
from infera.doctor.facts.engines import scan
from infera.doctor.facts.kernel import P2PDMA_SYMBOLS, config_option, kallsyms
from infera.doctor.facts.nvidia import CUFILE_JSON, parse_cufile_json
from infera.doctor.model import CheckResult, Evidence, Status, skip, worst
from infera.doctor.registry import check
from infera.keyrules import AIS_ENV, ROOTS_ENV, gpu_direct_in_env

MIN_OPEN_DRIVER = 565
DEFAULT_MAX_DIRECT_IO_KB = 16384
SMALL_DIRECT_IO_KB = 1024


@dataclass
class Request:
    wanted: bool = False
    must: bool = False
    where: list[str] = field(default_factory=list)


def gpu_direct_request(ctx: Context) -> Request:
    """Whether GPU-direct is asked for here, in an engine, or by a connected client."""
    out = Request()

    def note(ais: str | None, roots: str | None, where: str) -> None:
        if gpu_direct_in_env(ais, roots):
            out.wanted = True
            out.must = out.must or (ais or "").strip() == "1"
            out.where.append(f"{where}: {AIS_ENV}={ais}")

    note(ctx.environ.get(AIS_ENV), ctx.environ.get(ROOTS_ENV), "this environment")
    for eng in scan(ctx):
        note(eng.ais, eng.hipfile_roots, f"engine {eng.label}")
    stats = daemon_view(ctx).stats or {}
    for c in engine_clients(stats):
        if "cufile" in str(c.get("data_path", "")):
            out.wanted = True
            out.where.append(f"daemon client pid {c.get('pid')}: data path {c.get('data_path')}")
    return out


def _driver(text: str | None) -> tuple[bool, int | None]:
    """(open kernel modules, driver major) from /proc/driver/nvidia/version."""
    if not text:
        return False, None
    m = re.search(r"\s(\d{3})\.\d+", text)
    return "Open Kernel Module" in text, int(m.group(1)) if m else None


def _p2pdma_kernel(ctx: Context) -> bool | None:
    ks = kallsyms(ctx)
    if ks.readable and any(s in ks.found for s in P2PDMA_SYMBOLS):
        return True
    for cv in config_option(ctx, "CONFIG_PCI_P2PDMA"):
        if cv.value is not None:
            return cv.value == "y"
    return None


@check(
    "cufile-config",
    "cuFile settings vs GPU-direct (nvidia_fs, cufile.json)",
    "nvidia",
    order=20,
    needs=needs_nvidia_gpu,
)
def cufile_config(ctx: Context) -> CheckResult:
    h = ctx.host
    req = gpu_direct_request(ctx)
    ev = [Evidence("GPU-direct", "; ".join(req.where) or f"not requested ({AIS_ENV} unset or 0)", "note")]
    path = ctx.environ.get("CUFILE_ENV_PATH_JSON") or CUFILE_JSON
    raw = h.read(path)
    props: dict[str, object] = {}
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    if raw.text is None:
        ev.append(Evidence(h.display(path), raw.error or "unreadable"))
    else:
        try:
            props = dict(parse_cufile_json(raw.text).get("properties", {}) or {})  # type: ignore[call-overload]
        except ValueError as exc:
            findings.append((Status.WARN, f"{path} is not valid JSON ({exc}): cuFile uses its defaults"))
            fixes.append(f"fix the JSON of {path}")
        keys = ("allow_compat_mode", "force_compat_mode", "use_pci_p2pdma", "max_direct_io_size_kb")
        ev.append(
            Evidence(
                h.display(path), ", ".join(f"{k}={props[k]}" for k in keys if k in props) or "(defaults)"
            )
        )
    allow = props.get("allow_compat_mode", True) is not False
    p2p = props.get("use_pci_p2pdma") is True
    nvfs = h.is_dir("/sys/module/nvidia_fs") or bool(
        re.search(r"^nvidia_fs\s", h.text("/proc/modules") or "", re.MULTILINE)
    )
    ev.append(Evidence(h.display("/sys/module/nvidia_fs"), "loaded" if nvfs else "not loaded"))
    hard = Status.FAIL if req.must else Status.WARN
    if props.get("force_compat_mode") is True:
        findings.append(
            (hard, "cufile.json forces compatibility mode (force_compat_mode): no read is direct")
        )
        fixes.append(f'set "force_compat_mode": false in {path}')
    if p2p:
        open_mod, major = _driver(h.text("/proc/driver/nvidia/version"))
        ev.append(
            Evidence(
                h.display("/proc/driver/nvidia/version"), f"open kernel modules {open_mod}, driver {major}"
            )
        )
        if not open_mod or (major is not None and major < MIN_OPEN_DRIVER):
            findings.append(
                (
                    hard,
                    f"P2PDMA mode needs the open kernel modules >= {MIN_OPEN_DRIVER} (driver {major}, open {open_mod})",
                )
            )
            fixes.append(
                f"install the open NVIDIA kernel modules {MIN_OPEN_DRIVER} or newer, or use nvidia-fs mode"
            )
        multipath = h.value("/sys/module/nvme_core/parameters/multipath")
        if multipath:
            ev.append(Evidence(h.display("/sys/module/nvme_core/parameters/multipath"), multipath))
        if multipath == "Y":
            findings.append(
                (hard, "P2PDMA mode is not supported with NVMe multipath (nvme_core multipath=Y)")
            )
            fixes.append("boot with nvme_core.multipath=N (options nvme_core multipath=N)")
        if _p2pdma_kernel(ctx) is False:
            findings.append((hard, "P2PDMA mode needs a kernel with CONFIG_PCI_P2PDMA=y (see kernel-p2pdma)"))
            fixes.append("boot a kernel built with CONFIG_PCI_P2PDMA=y")
    elif not nvfs:
        if allow:
            findings.append(
                (
                    hard,
                    "nvidia_fs is not loaded and allow_compat_mode is true: cuFile silently runs every read in compat mode (POSIX)",
                )
            )
        else:
            findings.append(
                (
                    hard,
                    "nvidia_fs is not loaded and allow_compat_mode is false: cuFile refuses to open, GPU-direct is off",
                )
            )
        fixes.append(
            'load nvidia-fs (`sudo modprobe nvidia-fs`, package nvidia-gds) or configure P2PDMA mode ("use_pci_p2pdma": true)'
        )
    size = props.get("max_direct_io_size_kb", DEFAULT_MAX_DIRECT_IO_KB)
    if isinstance(size, int) and not isinstance(size, bool):
        if size % 4:
            findings.append(
                (
                    Status.WARN,
                    f"max_direct_io_size_kb {size} is not a multiple of 4 (cuFile needs 4 KiB-aligned I/O)",
                )
            )
            fixes.append(f'set "max_direct_io_size_kb" to a multiple of 4, e.g. {DEFAULT_MAX_DIRECT_IO_KB}')
        elif size < SMALL_DIRECT_IO_KB:
            findings.append(
                (
                    Status.WARN,
                    f"max_direct_io_size_kb {size}: a 128 MiB chunk read becomes {128 * 1024 // max(size, 1)} requests",
                )
            )
            fixes.append(f'raise "max_direct_io_size_kb" (default {DEFAULT_MAX_DIRECT_IO_KB})')
    problems = [t for _, t in findings]
    if not req.wanted:
        preview = f"; if turned on: {problems[0]}" if problems else ""
        return skip(f"GPU-direct not requested ({AIS_ENV} unset or 0 here and in every engine){preview}", ev)
    status = worst((s for s, _ in findings), Status.OK)
    mode = "NVMe P2PDMA mode" if p2p else "nvidia-fs mode"
    if not problems:
        tail = (
            "; allow_compat_mode true: the nvidia-fs Ops counters prove reads are direct"
            if allow and not p2p
            else ""
        )
        return CheckResult(status, f"GPU-direct requested, cuFile in {mode} with what it needs{tail}", ev)
    return CheckResult(status, "; ".join(problems), ev, fix="; ".join(dict.fromkeys(fixes)))
