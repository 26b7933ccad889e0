"""What the files under the disk tier's root are: the header check of one file, and the index
scan at start. Blocking, by directory descriptor (no link is ever followed); results are plain
objects the tier merges on the loop thread.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from infera.kvd import chunkfile as cf
from infera.kvd.keyspace import NS_PREFIX_LEN, fkey, fkey_key, fkey_prefix, ns_prefix
from infera.kvd.tiers.diskfs import STALE_TEMP_S, fan_parts, open_root, quarantine_at

log = logging.getLogger("infera.kvd.disk")

# -- what a file under a chunk name is ----------------------------------------------------------
OK, MISSING, IGNORED, CORRUPT, OTHER, ERROR = "ok", "missing", "ignored", "corrupt", "other", "error"


@dataclass
class Verdict:
    kind: str  # one of OK, MISSING, IGNORED (not a regular file), CORRUPT, OTHER (version), ERROR
    size: int = 0
    mtime_ns: int = 0
    why: str = ""


def check_at(dir_fd: int, name: str, key: bytes, ns8: bytes) -> Verdict:
    """Whether ``name`` in ``dir_fd`` is a usable chunk file of (``ns8``, ``key``): a regular
    file (never followed, never a FIFO: opening does not block), at least a header long, whose
    header parses, names this key and namespace and matches the file's size. The payload is
    not read (reads verify it)."""
    try:
        fd, st = cf.open_regular_stat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return Verdict(MISSING)
    except cf.NotRegular as exc:
        return Verdict(IGNORED, why=str(exc))
    except OSError as exc:
        return Verdict(ERROR, why=f"{name}: {exc.strerror}")
    try:
        if st.st_size < cf.HEADER_SIZE:
            return Verdict(CORRUPT, why=f"truncated file ({st.st_size} bytes, shorter than the header)")
        buf = os.pread(fd, cf.HEADER_SIZE, 0)
    except OSError as exc:
        return Verdict(ERROR, why=f"{name}: {exc.strerror}")
    finally:
        os.close(fd)
    try:
        hkey, digest, plen = cf.ChunkHeader.peek(buf)
    except cf.OtherVersion as exc:
        return Verdict(OTHER, why=str(exc))
    except cf.ChunkFileError as exc:
        return Verdict(CORRUPT, why=str(exc))
    if hkey != key:
        return Verdict(CORRUPT, why="file holds another key than its name says")
    if ns_prefix(digest) != ns8:
        return Verdict(CORRUPT, why="file belongs to another namespace than its directory says")
    if plen != st.st_size - cf.HEADER_SIZE:
        return Verdict(
            CORRUPT,
            why=f"truncated file ({st.st_size - cf.HEADER_SIZE} of {plen} payload bytes)",
        )
    return Verdict(OK, st.st_size, st.st_mtime_ns)


def check_chunk(root_fd: int, fkey: bytes) -> Verdict:
    """:func:`check_at` for the file of ``fkey`` (three directory opens, one file open)."""
    try:
        dfd = cf.open_dir_at(root_fd, fan_parts(fkey))
    except FileNotFoundError:
        return Verdict(MISSING)
    except OSError as exc:
        return Verdict(ERROR, why=exc.strerror or str(exc))
    try:
        return check_at(dfd, cf.file_name(fkey_key(fkey)), fkey_key(fkey), fkey_prefix(fkey))
    finally:
        os.close(dfd)


# -- the index scan at start ---------------------------------------------------------------
@dataclass
class ScanResult:
    entries: list[tuple[int, bytes, int]] = field(default_factory=list)  # (mtime_ns, fkey, size)
    other_version: int = 0
    quarantined: int = 0
    ignored: int = 0  # links, directories, FIFOs... under chunk names: left alone, never opened
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (file: what is wrong, where it went)
    stale_temps: int = 0
    young_temps: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def _count_files(path: str) -> int:
    n = 0
    for dirpath, _dirs, files in os.walk(path):
        n += sum(1 for f in files if f.endswith(cf.EXT) and not f.startswith("."))
        del dirpath
    return n


def _sweep_temp(dir_fd: int, path: str, entry: os.DirEntry[str], now: float, out: ScanResult) -> None:
    try:
        age = now - entry.stat(follow_symlinks=False).st_mtime
        if age >= STALE_TEMP_S:
            os.unlink(entry.name, dir_fd=dir_fd)
            out.stale_temps += 1
        else:
            out.young_temps.append(path)
    except OSError:
        pass


def _subdirs(dir_fd: int, path: str, out: ScanResult, now: float) -> list[str]:
    """Names of the real subdirectories of ``dir_fd`` (temporary files there are swept)."""
    names = []
    with os.scandir(dir_fd) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                names.append(e.name)
            elif cf.is_temp_name(e.name):
                _sweep_temp(dir_fd, os.path.join(path, e.name), e, now, out)
    return names


def scan_safely(root: str, only: set[tuple[bytes, int]] | None = None) -> ScanResult:
    """:func:`scan`, never raising (a failure is one unreadable entry: the tier never stays
    loading forever)."""
    try:
        return scan(root, only=only)
    except Exception as exc:
        log.exception("scanning the disk tier failed")
        return ScanResult(unreadable=[f"{root}: {exc}"])


def scan(root: str, now: float | None = None, only: set[tuple[bytes, int]] | None = None) -> ScanResult:
    """Walk the tree once, by directory descriptors (links are never followed): regular chunk
    files whose header checks out become index entries (:func:`check_at`: one 4 KiB read each;
    payloads are verified when a chunk is read); short or bad-header files are quarantined;
    links, directories and FIFOs under chunk names are counted and left alone; other format
    versions are counted; temporary files of dead writers are removed. Oldest first by mtime.
    ``only``: scan just these fan directories ((namespace prefix, fan byte); the rest as usual)."""
    now = time.time() if now is None else now
    out = ScanResult()
    try:
        root_fd = open_root(root)
    except OSError as exc:
        out.unreadable.append(f"{root}: {exc.strerror}")
        return out
    try:
        _scan(root_fd, root, now, out, only)
    finally:
        os.close(root_fd)
    out.entries.sort()
    return out


def _scan(root_fd: int, root: str, now: float, out: ScanResult, only: set[tuple[bytes, int]] | None) -> None:
    with os.scandir(root_fd) as it:
        top = [e for e in it if e.is_dir(follow_symlinks=False)]
    for d in top:
        if d.name == cf.QUARANTINE_DIR:
            out.quarantined = len(os.listdir(os.path.join(root, d.name)))
        elif d.name != cf.VERSION_DIR and d.name[:1] == "v" and d.name[1:].isdigit():
            out.other_version += _count_files(os.path.join(root, d.name))
    vpath = os.path.join(root, cf.VERSION_DIR)
    try:
        vfd = cf.open_dir_at(root_fd, [cf.VERSION_DIR])
    except FileNotFoundError:
        return
    except OSError as exc:
        out.unreadable.append(f"{vpath}: {exc.strerror}")
        return
    try:
        for ns, ns8 in namespace_dirs(vfd):
            if only is None or any(f[0] == ns8 for f in only):
                _scan_ns(root_fd, vfd, os.path.join(vpath, ns), ns, ns8, now, out, only)
    finally:
        os.close(vfd)


def namespace_dirs(vfd: int) -> list[tuple[str, bytes]]:
    """The namespace directories in ``v1`` (real directories named by a namespace prefix): their
    names and prefixes."""
    out = []
    with os.scandir(vfd) as it:
        names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    for name in names:
        try:
            ns8 = bytes.fromhex(name)
        except ValueError:
            continue
        if len(ns8) == NS_PREFIX_LEN:
            out.append((name, ns8))
    return out


_FAN_NAMES = {f"{i:02x}": i for i in range(256)}


def fan_byte(name: str) -> int:
    """The fan byte a fan directory's name stands for (-1 if it is not one)."""
    return _FAN_NAMES.get(name, -1)


def _open_sub(dir_fd: int, name: str, path: str, out: ScanResult) -> int | None:
    """The subdirectory ``name`` of ``dir_fd`` (at ``path``), or None, noted as unreadable."""
    try:
        return cf.open_dir_at(dir_fd, [name])
    except OSError as exc:
        out.unreadable.append(f"{path}: {exc.strerror}")
        return None


def _scan_ns(
    root_fd: int,
    vfd: int,
    path: str,
    ns: str,
    ns8: bytes,
    now: float,
    out: ScanResult,
    only: set[tuple[bytes, int]] | None,
) -> None:
    nsfd = _open_sub(vfd, ns, path, out)
    if nsfd is None:
        return
    try:
        for fan in _subdirs(nsfd, path, out, now):
            if only is not None and (ns8, fan_byte(fan)) not in only:
                continue
            fpath = os.path.join(path, fan)
            fanfd = _open_sub(nsfd, fan, fpath, out)
            if fanfd is None:
                continue
            try:
                _scan_fan(root_fd, fanfd, fpath, f"{cf.VERSION_DIR}-{ns}-{fan}", ns8, now, out)
            finally:
                os.close(fanfd)
    finally:
        os.close(nsfd)


def _scan_fan(
    root_fd: int, fanfd: int, path: str, label: str, ns8: bytes, now: float, out: ScanResult
) -> None:
    entries = out.entries
    with os.scandir(fanfd) as it:
        for e in it:
            name = e.name
            key = cf.key_from_name(name)
            if key is None:
                if cf.is_temp_name(name):
                    _sweep_temp(fanfd, os.path.join(path, name), e, now, out)
                continue
            try:
                regular = e.is_file(follow_symlinks=False)
            except OSError:
                continue
            if not regular:  # a link, directory, FIFO, socket or device: never opened
                out.ignored += 1
                continue
            v = check_at(fanfd, name, key, ns8)
            if v.kind == OK:
                entries.append((v.mtime_ns, fkey(ns8, key), v.size))
            elif v.kind == IGNORED:
                out.ignored += 1
            elif v.kind == OTHER:
                out.other_version += 1
            elif v.kind == CORRUPT:
                where = quarantine_at(root_fd, fanfd, name, f"{label}-{name}")
                out.quarantined += where is not None
                moved = f"moved to {where}" if where else "deleted"
                out.corrupt.append((f"{os.path.join(path, name)}: {v.why}", f"found at start; {moved}"))
            elif v.kind == ERROR:
                out.unreadable.append(v.why)


__all__ = [
    "CORRUPT",
    "ERROR",
    "IGNORED",
    "MISSING",
    "OK",
    "OTHER",
    "ScanResult",
    "Verdict",
    "check_at",
    "check_chunk",
    "fan_byte",
    "namespace_dirs",
    "scan",
    "scan_safely",
]
