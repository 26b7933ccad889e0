"""GPU-direct L3: chunk files read straight into GPU memory and written from it.

``INFERA_KVD_AIS`` asks for it (``1`` must use it or report a fallback loudly, ``auto`` uses it
when it works, ``0`` never), ``INFERA_KVD_HIPFILE_ROOTS=long=DIR`` names the directory, which
must be the daemon's ``--long-path``. The files are the disk tier's chunk files
(:mod:`infera.kvd.chunkfile`, the same code, not a copy); the connector writes them with the
checksum the GPU can compute (``wsum31``) and tells the daemon with ADOPT, so LOOKUP, capacity
and eviction keep working.

Two backends share one ctypes binding, because hipFile mirrors cuFile call for call: cuFile
(``libcufile.so.0``, from the CUDA toolkit or the ``nvidia-cufile`` wheel) and hipFile
(``libhipfile.so``, ROCm). :func:`select` decides, once per worker, whether one is used, and
records why not: no library, the driver does not open, compat mode (cuFile without the
``nvidia-fs`` kernel module, where every byte goes through a host bounce buffer), a filesystem
GPU-direct cannot serve, an unaligned chunk size. docs/gpu.md is the user-facing description.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infera.versions import parse_version

log = logging.getLogger("infera.engine.vllm")

HANDLE_TYPE_OPAQUE_FD = 1
ALIGN = 4096
GDS_FILESYSTEMS = {"ext4", "xfs"}  # local filesystems cuFile/hipFile serve without compat mode


class GpuDirectError(Exception):
    """A GPU-direct call failed; the message names the call and the error code."""


class _Err(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("drv_err", ctypes.c_int)]


class _HandleUnion(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class _Descr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle", _HandleUnion), ("fs_ops", ctypes.c_void_p)]


@dataclass
class Flavor:
    """What differs between cuFile and hipFile: names only."""

    name: str  # "cufile" / "hipfile"
    prefix: str  # "cuFile" / "hipFile"
    libraries: tuple[str, ...]


CUFILE = Flavor("cufile", "cuFile", ("libcufile.so.0", "libcufile.so"))
HIPFILE = Flavor("hipfile", "hipFile", ("libhipfile.so.0", "libhipfile.so", "/opt/rocm/lib/libhipfile.so"))


def _wheel_candidates(flavor: Flavor) -> list[str]:
    """Where the ``nvidia-cufile`` wheel puts the library (not on the loader path)."""
    if flavor is not CUFILE:
        return []
    out: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for base in list(spec.submodule_search_locations or []) if spec else []:
        out += sorted(glob.glob(os.path.join(base, "cufile", "lib", "libcufile.so*")))
        out += sorted(glob.glob(os.path.join(base, "cu*", "lib", "libcufile.so*")))
    return out


def load_library(flavor: Flavor) -> Any:
    """The backend's shared library, or raise OSError naming what was tried."""
    tried = [*flavor.libraries, *_wheel_candidates(flavor)]
    found = ctypes.util.find_library(flavor.prefix.lower())
    if found:
        tried.insert(0, found)
    errors = []
    for name in tried:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc).split(":")[-1].strip() or name)
    raise OSError(f"no {flavor.name} library ({', '.join(tried[:3])} not found)")


class FileApi:
    """The handful of cuFile/hipFile calls we use, over a loaded library (or a fake in tests)."""

    def __init__(self, lib: Any, flavor: Flavor) -> None:
        self.lib = lib
        self.flavor = flavor
        p = flavor.prefix
        self._open = getattr(lib, f"{p}DriverOpen")
        self._open.restype = _Err
        close = getattr(lib, f"{p}DriverClose_v2", None) or getattr(lib, f"{p}DriverClose", None)
        self._close = close
        if close is not None:
            close.restype = _Err
        self._hreg = getattr(lib, f"{p}HandleRegister")
        self._hreg.restype = _Err
        self._hreg.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Descr)]
        self._hdereg = getattr(lib, f"{p}HandleDeregister")
        self._hdereg.restype = None
        self._hdereg.argtypes = [ctypes.c_void_p]
        self._read = getattr(lib, f"{p}Read")
        self._write = getattr(lib, f"{p}Write")
        for fn in (self._read, self._write):
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long, ctypes.c_long]
        self._breg = getattr(lib, f"{p}BufRegister", None)
        if self._breg is not None:
            self._breg.restype = _Err
            self._breg.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._bdereg = getattr(lib, f"{p}BufDeregister", None)
        if self._bdereg is not None:
            self._bdereg.restype = _Err
            self._bdereg.argtypes = [ctypes.c_void_p]

    def _check(self, what: str, err: Any) -> None:
        if err.err != 0:
            raise GpuDirectError(f"{self.flavor.prefix}{what} failed: error {err.err} (driver {err.drv_err})")

    def driver_open(self) -> None:
        self._check("DriverOpen", self._open())

    def driver_close(self) -> None:
        if self._close is not None:
            self._close()

    def register_fd(self, fd: int) -> int:
        descr = _Descr()
        descr.type = HANDLE_TYPE_OPAQUE_FD
        descr.handle.fd = fd
        handle = ctypes.c_void_p()
        self._check("HandleRegister", self._hreg(ctypes.byref(handle), ctypes.byref(descr)))
        return int(handle.value or 0)

    def deregister(self, handle: int) -> None:
        self._hdereg(handle)

    def buf_register(self, ptr: int, size: int) -> bool:
        if self._breg is None:
            return False
        return bool(self._breg(ptr, size, 0).err == 0)

    def buf_deregister(self, ptr: int) -> None:
        if self._bdereg is not None:
            self._bdereg(ptr)

    def read(self, handle: int, ptr: int, size: int, file_off: int, buf_off: int = 0) -> int:
        return int(self._read(handle, ptr, size, file_off, buf_off))

    def write(self, handle: int, ptr: int, size: int, file_off: int, buf_off: int = 0) -> int:
        return int(self._write(handle, ptr, size, file_off, buf_off))


# -- selection --------------------------------------------------------------------------------
@dataclass
class HostFacts:
    """What selection looks at on the host; tests pass fixture values."""

    nvidia_fs: bool
    amdgpu_version: str | None
    fs_type: Callable[[str], str | None]


def _fs_type(path: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (longest mount point prefix)."""
    try:
        real = os.path.realpath(path)
        best, kind = "", None
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
        return kind
    except OSError:
        return None


def host_facts() -> HostFacts:
    amd = None
    try:
        with open("/sys/module/amdgpu/version") as fh:
            amd = fh.read().strip()
    except OSError:
        pass
    nvfs = os.path.exists("/sys/module/nvidia_fs") or os.path.exists("/proc/driver/nvidia-fs/version")
    return HostFacts(nvidia_fs=nvfs, amdgpu_version=amd, fs_type=_fs_type)


AMDGPU_AIS_MIN = "6.16.6"
_AIS_MIN_VERSION = parse_version(AMDGPU_AIS_MIN) or ()


@dataclass
class Selection:
    """The outcome of :func:`select`: a backend to use (or None) and what to report."""

    requested: bool = False
    api: FileApi | None = None
    flavor: str = ""
    compat: bool = False
    root: str = ""
    reasons: list[str] = field(default_factory=list)
    loud: bool = False

    @property
    def active(self) -> bool:
        return self.api is not None

    @property
    def fallback(self) -> bool:
        return self.requested and (not self.active or self.compat)

    @property
    def path_name(self) -> str:
        if not self.active:
            return ""
        return self.flavor + ("-compat" if self.compat else "")

    def reason(self) -> str | None:
        return "; ".join(self.reasons) if self.reasons else None


def select(
    ais: str,
    roots: dict[str, str],
    *,
    device_type: str,
    rocm: bool,
    chunk_bytes: int,
    facts: HostFacts | None = None,
    loader: Callable[[Flavor], Any] | None = None,
) -> Selection:
    """Decide whether GPU-direct is used, following ``INFERA_KVD_AIS`` (docs/gpu.md)."""
    must = ais == "1"
    sel = Selection(requested=must or (ais == "auto" and bool(roots)), loud=must)
    if not sel.requested:
        return sel

    def no(reason: str) -> Selection:
        sel.reasons.append(reason)
        sel.api = None
        return sel

    root = roots.get("long")
    if not root:
        return no("INFERA_KVD_HIPFILE_ROOTS has no long=DIR entry")
    sel.root = os.path.abspath(root)
    if device_type == "cpu":
        return no("the KV cache is not on a GPU")
    flavor = HIPFILE if rocm else CUFILE
    sel.flavor = flavor.name
    facts = facts or host_facts()
    if not os.path.isdir(sel.root):
        return no(f"{sel.root} is not a directory")
    fs = facts.fs_type(sel.root)
    if fs is not None and fs not in GDS_FILESYSTEMS:
        return no(f"filesystem {fs} at {sel.root}: GPU-direct needs ext4 or xfs")
    if chunk_bytes % ALIGN:
        return no(f"alignment: a {chunk_bytes}-byte chunk is not a multiple of {ALIGN} bytes")
    if rocm and facts.amdgpu_version and (parse_version(facts.amdgpu_version) or ()) < _AIS_MIN_VERSION:
        return no(
            f"amdgpu driver {facts.amdgpu_version} is older than {AMDGPU_AIS_MIN}: AIS is not initialized"
        )
    try:
        api = FileApi((loader or load_library)(flavor), flavor)
    except (OSError, AttributeError) as exc:
        return no(f"no driver/library: {exc}")
    try:
        api.driver_open()
    except GpuDirectError as exc:
        return no(f"no driver: {exc}")
    why = _probe_register(api, sel.root)
    if why is not None:
        api.driver_close()
        return no(why)
    compat = not rocm and not facts.nvidia_fs
    if compat:
        why = "compat mode: the nvidia-fs kernel module is not loaded, cuFile moves every byte through a host bounce buffer"
        if not must:
            api.driver_close()
            return no(why + "; auto keeps the arena path")
        sel.reasons.append(why)
    sel.api = api
    sel.compat = compat
    return sel


def _probe_register(api: FileApi, root: str) -> str | None:
    """Register one file under ``root`` the way reads and writes will: on the H200 VM the driver
    opens but every HandleRegister fails (it cannot read the block device's attributes), which
    must turn GPU-direct off at start, not fail every chunk later."""
    path = os.path.join(root, f".kvd-gd-probe-{os.getpid()}")
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * ALIGN)
        try:
            fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        except OSError:
            fd = os.open(path, os.O_RDWR)
        try:
            handle = api.register_fd(fd)
            api.deregister(handle)
        finally:
            os.close(fd)
    except GpuDirectError as exc:
        return f"{exc} for a file under {root} (see cufile.log; in VMs without udev data cuFile cannot read the volume's attributes)"
    except OSError as exc:
        return f"cannot create a file under {root}: {exc.strerror or exc}"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return None
