"""amdgpu, DKMS, Debian package and ROCm version strings, and the thresholds AIS needs.

None of these are SemVer: the loaded module may say ``6.16.6`` or ``6.19.14.31400000`` (from
driver 31.40 the fourth field encodes the package), DKMS versions carry a build number after the
dash, and one module version (6.16.6) is shipped by two packages (30.20.0 and 30.20.1), so the
minimum for AIS can only be judged on the build or package, not on the module string alone.
The leading dotted integers are read by :func:`infera.versions.parse_version`, the one version parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infera.versions import Version as Version
from infera.versions import parse_version as parse_version
from infera.versions import vstr as vstr

#: First module version that brings AIS up (product doc; measured there).
AIS_MIN_MODULE = (6, 16, 6)
#: First driver package with working AIS (hipFile INSTALL.md): amdgpu-dkms 30.20.1.
AIS_MIN_PACKAGE = (30, 20, 1)
#: DKMS build number of amdgpu-dkms 30.20.1.
AIS_MIN_BUILD = 2255209
#: ais-check trusts the KFD capability bit only on builds above this (KFD_AIS_CAPABILITY_MIN_VERSION).
KFD_BIT_MIN_BUILD = 2327936
#: ROCm release hipFile needs on host and image.
ROCM_MIN = (7, 2)

#: DKMS build numbers seen in the field and the driver package each belongs to.
KNOWN_BUILDS: dict[int, str] = {
    2226257: "30.10.2",
    2238411: "30.20.0",
    2255209: "30.20.1",
    2278356: "30.30.0",
    2327507: "30.30.3",
    2337710: "31.30.0",
    2341068: "30.30.4",
    2364437: "31.40.0",
}


def decode_package_code(code: int) -> Version | None:
    """``30200100`` -> ``(30, 20, 1)``: the MMmmpp00 field of module and package versions."""
    if code < 10_000_000 or code > 99_999_999:
        return None
    return (code // 1_000_000, code // 10_000 % 100, code // 100 % 100)


@dataclass(frozen=True)
class ModuleVersion:
    """An amdgpu module version split into the kernel-module part and, when encoded, the package."""

    raw: str
    module: Version
    package: Version | None = None


def parse_module_version(text: str | None) -> ModuleVersion | None:
    """``6.16.6`` or ``6.19.14.31400000`` (31.40+: fourth field = package). None for empty/garbage."""
    v = parse_version(text)
    if not v or text is None:
        return None
    pkg = decode_package_code(v[3]) if len(v) >= 4 else None
    return ModuleVersion(text.strip(), v[:3], pkg)


@dataclass(frozen=True)
class DkmsEntry:
    module: str
    version: str
    kernel: str | None
    arch: str | None
    state: str

    @property
    def build(self) -> int | None:
        return dkms_build(self.version)

    @property
    def module_version(self) -> Version | None:
        return parse_version(self.version)


def dkms_build(version: str) -> int | None:
    """The integer after the first dash: ``6.16.13-2278356.24.04`` -> 2278356."""
    m = re.match(r"[^-]*-(\d+)", version)
    return int(m.group(1)) if m else None


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    """Both shapes: ``amdgpu/6.16.6-2255209.24.04, 6.8.0-101-generic, x86_64: installed`` (dkms 3)
    and ``amdgpu, 6.16.13-2327937.24.04, 6.8.0-101, x86_64: installed`` (dkms 2)."""
    out: list[DkmsEntry] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or ":" not in line:
            continue
        head, _, state = line.rpartition(":")
        state = state.strip()
        fields = [f.strip() for f in head.split(",")]
        if "/" in fields[0]:
            module, _, version = fields[0].partition("/")
            rest = fields[1:]
        elif len(fields) >= 2:
            module, version, rest = fields[0], fields[1], fields[2:]
        else:
            continue
        kernel = rest[0] if rest else None
        arch = rest[1] if len(rest) > 1 else None
        out.append(DkmsEntry(module, version, kernel, arch, state.split("(")[0].strip()))
    return out


@dataclass(frozen=True)
class DebVersion:
    """``1:6.16.6.30200100-2255209.24.04`` = module 6.16.6, driver package 30.20.1, build 2255209."""

    raw: str
    module: Version | None
    package: Version | None
    build: int | None


def parse_amdgpu_dkms_package(version: str) -> DebVersion:
    body = version.split(":", 1)[1] if ":" in version else version
    upstream, _, rest = body.partition("-")
    v = parse_version(upstream) or ()
    module = v[:3] or None
    package = decode_package_code(v[3]) if len(v) >= 4 else None
    m = re.match(r"(\d+)", rest)
    return DebVersion(version, module, package, int(m.group(1)) if m else None)


def deb_package_version(status_text: str, package: str) -> str | None:
    """The installed version of ``package`` in a dpkg ``status`` file."""
    for block in status_text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if ":" in line and not line.startswith(" "):
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
        if fields.get("Package") == package and "installed" in fields.get("Status", "").split():
            return fields.get("Version")
    return None


def parse_rocm_version(text: str | None) -> Version | None:
    """``/opt/rocm/.info/version``: ``7.2.0`` or with a build suffix, ``6.4.0-15158``."""
    if not text:
        return None
    m = re.match(r"\s*(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in m.groups()) if m else None


def package_for_build(build: int | None) -> str | None:
    return KNOWN_BUILDS.get(build) if build is not None else None
