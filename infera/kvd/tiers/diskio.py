"""The blocking half of the disk tier: worker threads, the index scan and every file operation.

Nothing here touches the daemon's index or store: threads get plain job objects, do the file
I/O, and the tier hands results back to the loop thread with ``Server.call_soon``. Writes are
spread over lanes by key, so two writes (or a write and an unlink) of one key never race.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infera.errors import KvdError
from infera.kvd import chunkfile as cf
from infera.units import format_size

if TYPE_CHECKING:
    from infera.kvd.store import Chunk

log = logging.getLogger("infera.kvd.disk")

QUARANTINE_MAX = 64  # corrupt files kept for inspection; beyond that they are deleted
STALE_TEMP_S = 60.0  # a temporary file this old belongs to a writer that died


class Workers:
    """``n`` daemon threads running ``fn(job)``; lane-per-thread (ordered) or one shared queue."""

    def __init__(self, name: str, n: int, fn: Callable[[Any], None], lanes: bool) -> None:
        self._fn = fn
        count = max(1, n)
        self.queues: list[queue.SimpleQueue[Any]] = [
            queue.SimpleQueue() for _ in range(count if lanes else 1)
        ]
        self.threads = []
        for i in range(count):
            q = self.queues[i if lanes else 0]
            t = threading.Thread(target=self._run, args=(q,), name=f"kvd-{name}-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, q: queue.SimpleQueue[Any]) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                self._fn(job)
            except Exception:  # a bug must cost one job, never the thread
                log.exception("disk tier worker failed on a job")

    def submit(self, job: Any, lane: int = 0) -> None:
        self.queues[lane % len(self.queues)].put(job)

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; returns False if a thread is still busy at the deadline."""
        for q in self.queues:
            for _ in range(len(self.threads) if len(self.queues) == 1 else 1):
                q.put(None)
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)


class WriteJob:
    """One write-through of a sealed chunk (the chunk is pinned while the job is queued)."""

    __slots__ = ("cancelled", "chunk", "digest", "fkey", "ns_text", "retry", "size", "skipped")

    def __init__(self, chunk: Chunk, fkey: bytes, digest: bytes, ns_text: str, retry: bool) -> None:
        self.chunk = chunk
        self.fkey = fkey
        self.digest = digest
        self.ns_text = ns_text
        self.retry = retry  # handed out by Retries.due
        self.size = cf.HEADER_SIZE + chunk.length
        self.cancelled = False
        self.skipped = False


def write_job(job: WriteJob, arena: memoryview, root_fd: int, sync: str) -> OSError | None:
    """Writer thread: the chunk's bytes from the arena to its file; the error, if any."""
    chunk = job.chunk
    if job.cancelled or chunk.zombie:
        job.skipped = True
        return None
    view = arena[chunk.offset : chunk.offset + chunk.length]
    try:
        header = cf.make_header(job.digest, chunk.key, view, namespace_text=job.ns_text).pack()
        write_chunk_file(root_fd, job.digest, chunk.key, job.ns_text, header, view, sync)
    except OSError as exc:
        return exc
    finally:
        view.release()
    return None


def file_path(root: str, fkey: bytes) -> str:
    """Path of the file of index key ``fkey`` (8-byte namespace digest prefix + chunk key)."""
    key = fkey[8:]
    return os.path.join(root, cf.VERSION_DIR, fkey[:8].hex(), cf.fan_dirname(key), cf.file_name(key))


# -- the tree, relative to the root's descriptor ----------------------------------------------
# Everything the tier creates, renames or removes goes through a directory descriptor opened
# level by level with O_NOFOLLOW (chunkfile.open_dir_at): a symbolic link planted anywhere
# under --long-path is never followed, so no file outside it is ever created, written, moved
# or removed.
def fan_parts(fkey: bytes) -> list[str]:
    return [cf.VERSION_DIR, fkey[:8].hex(), cf.fan_dirname(fkey[8:])]


def open_root(root: str) -> int:
    """The tier root's descriptor (the configured path itself may be a link: the admin's choice)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_lock(root_fd: int) -> int:
    """``<root>/.lock``, never through a link (one planted there is removed first)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(".lock", flags, 0o644, dir_fd=root_fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        log.warning("disk tier: removing a symbolic link planted at .lock")
        os.unlink(".lock", dir_fd=root_fd)
        return os.open(".lock", flags | os.O_EXCL, 0o644, dir_fd=root_fd)


def open_tree(root: str) -> tuple[int, int]:
    """Create and lock the tier root: (root descriptor, lock descriptor). KvdError if unusable."""
    try:
        os.makedirs(root, exist_ok=True)
        root_fd = open_root(root)
        os.close(cf.open_dir_at(root_fd, [cf.VERSION_DIR], create=True))
        fd = open_lock(root_fd)
    except OSError as exc:
        link = f" ({cf.VERSION_DIR} is not a directory)" if isinstance(exc, NotADirectoryError) else ""
        raise KvdError(
            f"--long-path {root}: {exc.strerror}{link}",
            hint="give a directory this user can create and write",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        os.close(root_fd)
        raise KvdError(
            f"--long-path {root} is in use by another kvd daemon",
            hint="each daemon needs its own --long-path",
        ) from None
    return root_fd, fd


def check_space(root: str, capacity: int) -> None:
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return
    if free < capacity:
        log.warning(
            "the filesystem of %s has %s free, less than --long-bytes %s: writes will fail "
            "with ENOSPC before the tier is full (counted in failed_writes, retried)",
            root,
            format_size(free),
            format_size(capacity),
        )


def write_chunk_file(
    root_fd: int, digest: bytes, key: bytes, ns_text: str, header: bytes, payload: cf.Buffer, sync: str
) -> None:
    """Write one chunk file (directories and the namespace file created as needed)."""
    for attempt in (0, 1):
        dfd = cf.ensure_dir_at(root_fd, digest, key, ns_text)
        try:
            cf.write_file_at(dfd, cf.file_name(key), header, payload, sync=sync)
            return
        except FileNotFoundError:  # the directory was removed behind our back: once more
            if attempt:
                raise
        finally:
            os.close(dfd)


def unlink_chunk(root_fd: int, fkey: bytes) -> None:
    try:
        dfd = cf.open_dir_at(root_fd, fan_parts(fkey))
    except FileNotFoundError:
        return
    try:
        os.unlink(cf.file_name(fkey[8:]), dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def unlink_rel(root_fd: int, rel: str) -> None:
    """Remove ``root/rel`` (a temporary file) without following links on the way."""
    *parts, name = rel.split(os.sep)
    dfd = cf.open_dir_at(root_fd, parts)
    try:
        os.unlink(name, dir_fd=dfd)
    finally:
        os.close(dfd)


def sweep_young(root_fd: int, root: str, paths: list[str]) -> tuple[list[str], int]:
    """Remove the temporary files of ``paths`` that are now stale: (those kept, removed count)."""
    now = time.time()
    keep = []
    removed = 0
    for path in paths:
        try:
            if now - os.stat(path, follow_symlinks=False).st_mtime >= STALE_TEMP_S:
                unlink_rel(root_fd, os.path.relpath(path, root))
                removed += 1
            else:
                keep.append(path)
        except OSError:
            pass
    return keep, removed


_unsafe_quarantine_logged = False


def quarantine_at(root_fd: int, dir_fd: int, name: str, label: str) -> str | None:
    """Move the corrupt file ``name`` of ``dir_fd`` into ``<root>/quarantine`` (or delete it once
    the quarantine is full, or when it is not a real directory); returns the new name."""
    global _unsafe_quarantine_logged
    try:
        try:
            qfd = cf.open_dir_at(root_fd, [cf.QUARANTINE_DIR], create=True)
        except NotADirectoryError:  # a link or a file planted there: never move anything through it
            if not _unsafe_quarantine_logged:
                _unsafe_quarantine_logged = True
                log.warning("disk tier: %s is not a directory; corrupt files are deleted", cf.QUARANTINE_DIR)
            os.unlink(name, dir_fd=dir_fd)
            return None
        try:
            if len(os.listdir(qfd)) >= QUARANTINE_MAX:
                os.unlink(name, dir_fd=dir_fd)
                return None
            target = f"{time.strftime('%Y%m%dT%H%M%S')}-{label}"
            os.rename(name, target, src_dir_fd=dir_fd, dst_dir_fd=qfd)
            return os.path.join(cf.QUARANTINE_DIR, target)
        finally:
            os.close(qfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot quarantine %s: %s", label, exc.strerror)
        return None


def quarantine(root_fd: int, fkey: bytes) -> str | None:
    """:func:`quarantine_at` for the file of ``fkey``."""
    try:
        dfd = cf.open_dir_at(root_fd, fan_parts(fkey))
    except OSError:
        return None
    try:
        return quarantine_at(
            root_fd, dfd, cf.file_name(fkey[8:]), "-".join(fan_parts(fkey)) + "-" + cf.file_name(fkey[8:])
        )
    finally:
        os.close(dfd)


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
        fd = cf.open_regular(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return Verdict(MISSING)
    except cf.NotRegular as exc:
        return Verdict(IGNORED, why=str(exc))
    except OSError as exc:
        return Verdict(ERROR, why=f"{name}: {exc.strerror}")
    try:
        st = os.fstat(fd)
        if st.st_size < cf.HEADER_SIZE:
            return Verdict(CORRUPT, why=f"truncated file ({st.st_size} bytes, shorter than the header)")
        buf = os.pread(fd, cf.HEADER_SIZE, 0)
    except OSError as exc:
        return Verdict(ERROR, why=f"{name}: {exc.strerror}")
    finally:
        os.close(fd)
    try:
        header = cf.ChunkHeader.unpack(buf)
    except cf.OtherVersion as exc:
        return Verdict(OTHER, why=str(exc))
    except cf.ChunkFileError as exc:
        return Verdict(CORRUPT, why=str(exc))
    if header.key != key:
        return Verdict(CORRUPT, why="file holds another key than its name says")
    if header.namespace_digest[:8] != ns8:
        return Verdict(CORRUPT, why="file belongs to another namespace than its directory says")
    if header.payload_length != st.st_size - cf.HEADER_SIZE:
        return Verdict(
            CORRUPT,
            why=f"truncated file ({st.st_size - cf.HEADER_SIZE} of {header.payload_length} payload bytes)",
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
        return check_at(dfd, cf.file_name(fkey[8:]), fkey[8:], fkey[:8])
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


def scan(root: str, now: float | None = None) -> ScanResult:
    """Walk the tree once, by directory descriptors (links are never followed): regular chunk
    files whose header checks out become index entries (:func:`check_at`: one 4 KiB read each;
    payloads are verified when a chunk is read); short or bad-header files are quarantined;
    links, directories and FIFOs under chunk names are counted and left alone; other format
    versions are counted; temporary files of dead writers are removed. Oldest first by mtime."""
    now = time.time() if now is None else now
    out = ScanResult()
    try:
        root_fd = open_root(root)
    except OSError as exc:
        out.unreadable.append(f"{root}: {exc.strerror}")
        return out
    try:
        _scan(root_fd, root, now, out)
    finally:
        os.close(root_fd)
    out.entries.sort()
    return out


def _scan(root_fd: int, root: str, now: float, out: ScanResult) -> None:
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
        with os.scandir(vfd) as it:
            ns_names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        for ns in ns_names:
            try:
                ns8 = bytes.fromhex(ns)
            except ValueError:
                continue
            if len(ns8) == 8:
                _scan_ns(root_fd, vfd, os.path.join(vpath, ns), ns, ns8, now, out)
    finally:
        os.close(vfd)


def _scan_ns(root_fd: int, vfd: int, path: str, ns: str, ns8: bytes, now: float, out: ScanResult) -> None:
    try:
        nsfd = cf.open_dir_at(vfd, [ns])
    except OSError as exc:
        out.unreadable.append(f"{path}: {exc.strerror}")
        return
    try:
        for fan in _subdirs(nsfd, path, out, now):
            fpath = os.path.join(path, fan)
            try:
                fanfd = cf.open_dir_at(nsfd, [fan])
            except OSError as exc:
                out.unreadable.append(f"{fpath}: {exc.strerror}")
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
                entries.append((v.mtime_ns, ns8 + key, v.size))
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


def describe(exc: OSError) -> str:
    """An I/O failure in words; a link or file planted where a directory should be says so."""
    text = exc.strerror or str(exc)
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        text += " (a symbolic link or file where the tier needs a directory: never followed)"
    return text


def classify_os_error(exc: OSError) -> str:
    """A short, stable name for an I/O failure (used to log each condition once)."""
    return errno.errorcode.get(exc.errno or 0, "EIO") if exc.errno else "EIO"


__all__ = [
    "ScanResult",
    "Verdict",
    "Workers",
    "WriteJob",
    "check_at",
    "check_chunk",
    "check_space",
    "classify_os_error",
    "describe",
    "file_path",
    "open_lock",
    "open_root",
    "open_tree",
    "quarantine",
    "quarantine_at",
    "scan",
    "sweep_young",
    "unlink_chunk",
    "unlink_rel",
    "write_chunk_file",
    "write_job",
]
