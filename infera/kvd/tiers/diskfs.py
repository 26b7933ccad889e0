"""Every file operation of the disk tier under its root, by directory descriptor.

Blocking; called from the tier's worker threads (and, for a few header checks, from the loop).
Nothing here touches the daemon's index or store.

Everything the tier creates, renames or removes goes through a directory descriptor opened
level by level with O_NOFOLLOW (chunkfile.open_dir_at): a symbolic link planted anywhere under
--long-path is never followed, so no file outside it is ever created, written, moved or removed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import time

from infera.errors import KvdError
from infera.kvd import chunkfile as cf
from infera.kvd.keyspace import fkey_key, fkey_prefix
from infera.units import format_size

log = logging.getLogger("infera.kvd.disk")

QUARANTINE_MAX = 64  # corrupt files kept for inspection; beyond that they are deleted
STALE_TEMP_S = 60.0  # a temporary file this old belongs to a writer that died


def file_path(root: str, fkey: bytes) -> str:
    """Path of the file of index key ``fkey`` (see :mod:`infera.kvd.keyspace`)."""
    return os.path.join(root, cf.relpath(fkey_prefix(fkey), fkey_key(fkey)))


def fan_parts(fkey: bytes) -> list[str]:
    """The directories of ``fkey``'s file, below the root."""
    return [cf.VERSION_DIR, cf.ns_dirname(fkey_prefix(fkey)), cf.fan_dirname(fkey_key(fkey))]


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
    except (FileExistsError, NotADirectoryError):  # a file at the path, or in the way of it
        raise KvdError(
            f"--long-path {root} is not a directory (a file is at the path or in the way of it)",
            hint="give the disk tier a directory of its own (it is created if missing)",
        ) from None
    except OSError as exc:
        raise KvdError(
            f"--long-path {root}: {exc.strerror}", hint="give a directory this user can create and write"
        ) from None
    try:
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


def write_chunk(
    root_fd: int, digest: bytes, key: bytes, ns_text: str, payload: memoryview, sync: str
) -> None:
    """Write one chunk file, header made here (directories and the namespace file as needed)."""
    header = cf.make_header(digest, key, payload, namespace_text=ns_text).pack()
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
        os.unlink(cf.file_name(fkey_key(fkey)), dir_fd=dfd)
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
            root_fd,
            dfd,
            cf.file_name(fkey_key(fkey)),
            "-".join(fan_parts(fkey)) + "-" + cf.file_name(fkey_key(fkey)),
        )
    finally:
        os.close(dfd)


def describe(exc: BaseException) -> str:
    """A failure in words; a link or file planted where a directory should be says so."""
    if not isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc}"
    text = exc.strerror or str(exc)
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        text += " (a symbolic link or file where the tier needs a directory: never followed)"
    return text


def classify_os_error(exc: BaseException) -> str:
    """A short, stable name for a failure (used to log each condition once)."""
    if not isinstance(exc, OSError):
        return "bug"
    return errno.errorcode.get(exc.errno or 0, "EIO") if exc.errno else "EIO"


__all__ = [
    "QUARANTINE_MAX",
    "STALE_TEMP_S",
    "check_space",
    "classify_os_error",
    "describe",
    "fan_parts",
    "file_path",
    "open_lock",
    "open_root",
    "open_tree",
    "quarantine",
    "quarantine_at",
    "sweep_young",
    "unlink_chunk",
    "unlink_rel",
    "write_chunk",
]
