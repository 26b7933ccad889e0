"""Run AMD's ``ais-check`` and parse every output generation seen in the field.

The summary lines look like ``\\tamdgpu                  : True``: a tab, the component name, padding,
``: True|False``; there is no ``amdgpu:`` token. Older versions print three components, newer
four; some print a ``Supported filesystems:`` list, others a ``Mounted volumes:`` table whose
lines end in padding. Exit status is 0 only when every component is True.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infera.doctor.context import Context
from infera.doctor.runner import CommandResult

AIS_CHECK_PATHS = ("/opt/rocm/bin/ais-check",)
_LINE = re.compile(r"^\s+(\S.*?)\s*:\s*(True|False)\s*$")

KERNEL_P2PDMA = "Kernel P2PDMA support"
HIP_RUNTIME = "HIP runtime"
AMDGPU = "amdgpu"
VOLUME = "hipFile-capable volume"


@dataclass
class Volume:
    mountpoint: str
    fstype: str
    device: str
    backing: str
    o_direct: str
    hipfile: str


@dataclass
class AisCheckOutput:
    components: dict[str, bool] = field(default_factory=dict)
    volumes: list[Volume] = field(default_factory=list)
    filesystems: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)
    banner: str | None = None
    notes: list[str] = field(default_factory=list)
    vf_warning: str | None = None
    no_kernel_config: bool = False

    def get(self, name: str) -> bool | None:
        for key, val in self.components.items():
            if key.lower() == name.lower():
                return val
        return None


def parse(stdout: str, stderr: str = "") -> AisCheckOutput:
    out = AisCheckOutput()
    section: str | None = None
    header: list[tuple[str, int]] | None = None
    for raw in stdout.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            section = None
            continue
        if stripped.endswith(":") and not raw.startswith(("\t", " ")):
            name = stripped[:-1].lower()
            section = {
                "ais support in": "summary",
                "mounted volumes": "volumes",
                "supported filesystems": "filesystems",
                "filesystems": "filesystems",
            }.get(name, "libraries" if name.startswith("found these hip libraries") else None)
            header = None
            continue
        if section == "summary" or (section is None and _LINE.match(line)):
            m = _LINE.match(line)
            if m:
                out.components[m.group(1)] = m.group(2) == "True"
            continue
        if section == "volumes":
            if stripped.startswith("MOUNTPOINT"):
                header = _columns(line)
            elif header:
                out.volumes.append(_volume(line, header))
            elif stripped.startswith("No block-backed volumes"):
                out.notes.append(stripped)
            continue
        if section == "filesystems":
            out.filesystems.append(stripped)
            continue
        if section == "libraries":
            out.libraries.append(stripped)
            continue
        if out.banner is None and section is None:
            out.banner = stripped
    err_lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for i, ln in enumerate(err_lines):
        if ln.startswith("WARNING: SR-IOV"):
            out.vf_warning = " ".join(err_lines[i : i + 2])
        elif "No kernel config files found" in ln:
            out.no_kernel_config = True
            out.notes.append(ln)
        elif not ln.startswith(("hipFile's fast path", "Traceback")):
            out.notes.append(ln)
    return out


def _columns(header: str) -> list[tuple[str, int]]:
    return [(m.group(0), m.start()) for m in re.finditer(r"\S+", header)]


def _volume(line: str, header: list[tuple[str, int]]) -> Volume:
    cells: list[str] = []
    for i, (_, start) in enumerate(header):
        end = header[i + 1][1] if i + 1 < len(header) else len(line)
        cells.append(line[start:end].strip())
    while len(cells) < 6:
        cells.append("")
    return Volume(*cells[:6])


@dataclass
class AisCheckRun:
    result: CommandResult
    output: AisCheckOutput | None


def run(ctx: Context) -> AisCheckRun:
    """Run ais-check once (it probes every mount and dlopens HIP, so never twice)."""

    def go(c: Context) -> AisCheckRun:
        res = c.runner.run(["ais-check"], also=AIS_CHECK_PATHS, timeout=60)
        if not res.ran:
            return AisCheckRun(res, None)
        return AisCheckRun(res, parse(res.stdout, res.stderr))

    return ctx.memo("ais_check", go)
