"""NVIDIA GPUDirect Storage: the nvidia-fs module and its counters, ``gdscheck -p``, cufile.json.

``gdscheck``'s exit status is not documented, so only its text is used. ``use_compat_mode: true``
means cuFile *may* fall back to POSIX, not that it does; the nvidia-fs ``Ops`` counters are the
hard evidence of the direct path (in nvidia-fs mode; the NVMe P2PDMA mode bypasses nvidia-fs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

GDSCHECK_PATHS = ("/usr/local/cuda/gds/tools/gdscheck",)
NVFS_STATS = "/proc/driver/nvidia-fs/stats"
CUFILE_JSON = "/etc/cufile.json"


@dataclass
class NvfsStats:
    version: str | None = None
    driver: str | None = None
    ops: dict[str, int] = field(default_factory=dict)
    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)


def parse_nvfs_stats(text: str) -> NvfsStats:
    s = NvfsStats()
    for line in text.splitlines():
        line = line.strip()
        if m := re.match(r"GDS Version:\s*(\S+)", line):
            s.version = m.group(1)
        elif m := re.match(r"NVFS Driver\s*\(version:\s*([^)]+)\)", line):
            s.driver = m.group(1).strip()
        elif line.startswith("Ops"):
            s.ops = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        elif line.startswith("Reads"):
            s.reads = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        elif line.startswith("Writes"):
            s.writes = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        elif line.startswith("GPU "):
            s.gpus.append(line)
    return s


@dataclass
class GdsCheck:
    release: str | None = None
    drivers: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    platform: dict[str, str] = field(default_factory=dict)
    verified: bool | None = None


def parse_gdscheck(text: str) -> GdsCheck:
    g = GdsCheck()
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or set(line) == {"="}:
            continue
        if m := re.match(r"GDS release version:\s*(\S+)", line):
            g.release = m.group(1)
            continue
        if line.endswith(":") and line[:-1].isupper():
            section = line[:-1]
            continue
        if line.startswith("Platform verification"):
            g.verified = "succeeded" in line
            continue
        key, sep, val = line.partition(" : ")
        if section == "DRIVER CONFIGURATION" and sep:
            g.drivers[key.strip()] = val.strip()
        elif section == "CUFILE CONFIGURATION" and sep:
            g.properties[key.strip()] = val.strip()
        elif section == "GPU INFO":
            g.gpus.append(line)
        elif section == "PLATFORM INFO" and (sep or ":" in line):
            k, _, v = line.partition(":")
            g.platform[k.strip()] = v.strip()
    return g


def parse_cufile_json(text: str) -> dict[str, object]:
    """cufile.json allows ``//`` comments and trailing commas; strip them before parsing."""
    out_lines = []
    for line in text.splitlines():
        in_str = False
        cut = len(line)
        for i, ch in enumerate(line):
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            elif not in_str and line.startswith("//", i):
                cut = i
                break
        out_lines.append(line[:cut])
    cleaned = re.sub(r",(\s*[}\]])", r"\1", "\n".join(out_lines))
    data = json.loads(cleaned)
    return data if isinstance(data, dict) else {}


def truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("on", "true", "yes", "1"):
        return True
    if v in ("off", "false", "no", "0"):
        return False
    return None
