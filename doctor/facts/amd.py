"""The amdgpu driver: what is loaded (sysfs), what is installed (modinfo, DKMS, the package).

The loaded side comes from the running kernel and is valid anywhere; the installed side reads
``/lib/modules``, the DKMS tree and the package database of the filesystem we are in, so inside a
container it describes the image, not the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infera.doctor.context import Context
from infera.doctor.facts.versions import (
    DebVersion,
    DkmsEntry,
    ModuleVersion,
    deb_package_version,
    parse_amdgpu_dkms_package,
    parse_dkms_status,
    parse_module_version,
)
from infera.doctor.model import Evidence

SYS_MODULE = "/sys/module/amdgpu"


@dataclass
class LoadedDriver:
    """The amdgpu module in the running kernel. ``in_kernel`` = loaded without a version (not DKMS)."""

    loaded: bool
    version: ModuleVersion | None
    srcversion: str | None
    taint: str | None
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def in_kernel(self) -> bool:
        return self.loaded and self.version is None


def loaded_driver(ctx: Context) -> LoadedDriver:
    def read(c: Context) -> LoadedDriver:
        h = c.host
        ev: list[Evidence] = []
        if not h.is_dir(SYS_MODULE):
            ev.append(Evidence(h.display(SYS_MODULE), "absent (amdgpu not loaded)"))
            return LoadedDriver(False, None, None, None, ev)
        raw = h.read(f"{SYS_MODULE}/version")
        ev.append(
            Evidence(
                h.display(f"{SYS_MODULE}/version"), repr(raw.text.strip()) if raw.text else raw.error or ""
            )
        )
        src = h.value(f"{SYS_MODULE}/srcversion")
        if src is not None:
            ev.append(Evidence(h.display(f"{SYS_MODULE}/srcversion"), src))
        taint = h.value(f"{SYS_MODULE}/taint")
        if taint is not None:
            ev.append(Evidence(h.display(f"{SYS_MODULE}/taint"), taint or "(none)"))
        return LoadedDriver(True, parse_module_version(raw.text), src or None, taint, ev)

    return ctx.memo("amdgpu_loaded", read)


@dataclass
class InstalledDriver:
    """``modinfo amdgpu`` for the running kernel's release. ``error`` says why it is unknown."""

    version: ModuleVersion | None
    srcversion: str | None
    filename: str | None
    error: str | None
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def is_dkms(self) -> bool:
        return bool(self.filename and ("/updates/" in self.filename or "/extra/" in self.filename))


def installed_driver(ctx: Context) -> InstalledDriver:
    def read(c: Context) -> InstalledDriver:
        rel = c.host.kernel_release()
        base = [] if c.live else ["-b", str(c.host.root)]
        kver = ["-k", rel] if rel else []
        ev: list[Evidence] = []
        fields: dict[str, str | None] = {}
        for name in ("version", "srcversion", "filename"):
            res = c.runner.run(["modinfo", *base, *kver, "-F", name, "amdgpu"])
            if not res.ran:
                ev.append(Evidence(res.line, res.error or "", "command"))
                return InstalledDriver(None, None, None, f"modinfo {res.error}", ev)
            if res.returncode != 0:
                msg = res.first_error_line() or f"exit {res.returncode}"
                ev.append(Evidence(res.line, msg, "command"))
                return InstalledDriver(None, None, None, msg, ev)
            val = res.stdout.strip() or None
            fields[name] = val
            ev.append(Evidence(res.line, repr(val) if val else "(empty)", "command"))
        return InstalledDriver(
            parse_module_version(fields["version"]), fields["srcversion"], fields["filename"], None, ev
        )

    return ctx.memo("amdgpu_installed", read)


@dataclass
class DkmsInfo:
    """DKMS builds of amdgpu (from ``dkms status`` or the ``/var/lib/dkms`` tree) and the package."""

    entries: list[DkmsEntry]
    package: DebVersion | None
    error: str | None
    evidence: list[Evidence] = field(default_factory=list)

    def for_kernel(self, release: str | None) -> DkmsEntry | None:
        """The build for the running kernel, else the newest installed build (ais-check's rule)."""
        mine = [e for e in self.entries if e.module == "amdgpu" and e.kernel == release]
        pool = mine or [e for e in self.entries if e.module == "amdgpu"]
        installed = [e for e in pool if e.state.startswith("installed")] or pool
        return max(installed, key=lambda e: e.build or 0) if installed else None


def dkms_info(ctx: Context) -> DkmsInfo:
    return ctx.memo("dkms", _dkms_info)


def _dkms_info(ctx: Context) -> DkmsInfo:
    h = ctx.host
    ev: list[Evidence] = []
    entries: list[DkmsEntry] = []
    error: str | None = None
    if ctx.live:
        res = ctx.runner.run(["dkms", "status", "amdgpu"])
        if res.ok:
            entries = parse_dkms_status(res.stdout)
            ev.append(Evidence(res.line, res.stdout.strip() or "(no amdgpu builds)", "command"))
        else:
            error = res.error or res.first_error_line() or f"exit {res.returncode}"
            ev.append(Evidence(res.line, error, "command"))
    if not entries:
        tree = "/var/lib/dkms/amdgpu"
        for ver in h.listdir(tree):
            if not ver[:1].isdigit():
                continue
            for kernel in h.listdir(f"{tree}/{ver}"):
                if kernel in ("source", "build"):
                    continue
                for arch in h.listdir(f"{tree}/{ver}/{kernel}"):
                    built = h.exists(f"{tree}/{ver}/{kernel}/{arch}/module")
                    entries.append(DkmsEntry("amdgpu", ver, kernel, arch, "installed" if built else "built"))
        if entries:
            error = None
            ev.append(
                Evidence(h.display(tree), "; ".join(f"{e.version} for {e.kernel}" for e in entries), "file")
            )
        elif not ctx.live:
            error = f"no DKMS builds under {tree}"
    package = None
    status = h.text("/var/lib/dpkg/status")
    if status:
        pkg_ver = deb_package_version(status, "amdgpu-dkms")
        if pkg_ver:
            package = parse_amdgpu_dkms_package(pkg_ver)
            ev.append(Evidence(h.display("/var/lib/dpkg/status"), f"amdgpu-dkms {pkg_ver}"))
    return DkmsInfo(entries, package, error, ev)
