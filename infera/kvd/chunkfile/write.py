"""Writing chunk files: directories opened with O_NOFOLLOW, files created O_EXCL under a random
temporary name and renamed into place."""

from __future__ import annotations

import os

from infera.kvd.chunkfile.format import NAMESPACE_FILE, TMP_SUFFIX, VERSION_DIR, Buffer
from infera.kvd.chunkfile.header import make_header
from infera.kvd.chunkfile.names import fan_dirname, ns_dirname, relpath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_name(base: str) -> str:
    """A fresh temporary name for ``base`` in the same directory (random: nobody can plant a
    file under it ahead of time)."""
    return f".{base}.{os.urandom(8).hex()}{TMP_SUFFIX}"


def skip_done(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``views``, the ones a vectored read or write just moved."""
    while views and n >= views[0].nbytes:
        n -= views[0].nbytes
        views.pop(0)
    if views and n:
        views[0] = views[0][n:]


def _write_all(fd: int, bufs: list[Buffer]) -> int:
    views = [memoryview(b).cast("B") for b in bufs]
    views = [v for v in views if v.nbytes]
    pos = 0
    while views:
        n = os.pwritev(fd, views, pos)
        if n <= 0:
            raise OSError(5, "short write")
        pos += n
        skip_done(views, n)
    return pos


def open_dir_at(dir_fd: int, names: list[str], create: bool = False) -> int:
    """Open the directory ``dir_fd/names[0]/names[1]/...`` (creating missing levels when
    ``create``) without following a symbolic link at any level; returns a new descriptor.
    A link or a file where a directory should be raises OSError (ENOTDIR)."""
    fd = os.dup(dir_fd)
    try:
        for name in names:
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_dir_at(root_fd: int, digest: bytes, key: bytes, namespace_text: str = "") -> int:
    """Open (creating it if missing) the chunk's directory under the tier root ``root_fd``;
    writes the namespace's ``namespace`` file if it is missing. Returns a new descriptor."""
    ns_fd = open_dir_at(root_fd, [VERSION_DIR, ns_dirname(digest)], create=True)
    try:
        if namespace_text:
            try:
                os.stat(NAMESPACE_FILE, dir_fd=ns_fd, follow_symlinks=False)
            except FileNotFoundError:
                write_small_file_at(ns_fd, NAMESPACE_FILE, namespace_text.encode())
        return open_dir_at(ns_fd, [fan_dirname(key)], create=True)
    finally:
        os.close(ns_fd)


def ensure_dir(root: str, digest: bytes, key: bytes, namespace_text: str = "") -> str:
    """Create the chunk's directory (and the namespace's ``namespace`` file) if missing; returns
    its path. No level below ``root`` may be a symbolic link (OSError ENOTDIR)."""
    os.makedirs(root, exist_ok=True)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(ensure_dir_at(root_fd, digest, key, namespace_text))
    finally:
        os.close(root_fd)
    return os.path.join(root, VERSION_DIR, ns_dirname(digest), fan_dirname(key))


def write_small_file_at(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` in ``dir_fd`` through a temporary name, with no sync: a
    :func:`write_file_at` of ``data`` alone."""
    write_file_at(dir_fd, name, data, b"", sync="none")


def write_small_file(path: str, data: bytes) -> None:
    """:func:`write_small_file_at` by path (the directory of ``path`` must exist)."""
    write_file(path, data, b"", sync="none")


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def write_file_at(dir_fd: int, name: str, header: bytes, payload: Buffer, *, sync: str = "data") -> int:
    """Write header + payload as ``name`` in the directory ``dir_fd``, through a temporary name
    created with O_EXCL | O_NOFOLLOW and renamed into place; returns the bytes written.

    ``sync``: ``none`` (page cache only), ``data`` (fdatasync before the rename, so a name never
    points at unwritten data), ``always`` (also fsync the directory after the rename, so the
    chunk survives a power loss). On error the temporary file is removed and OSError raised.
    The rename replaces whatever entry held ``name`` (a planted link is replaced, not followed)."""
    tmp = temp_name(name)
    fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=dir_fd)
    try:
        n = _write_all(fd, [header, payload])
        if sync != "none":
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        fd = -1
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(tmp, dir_fd)
        raise
    if sync == "always":
        os.fsync(dir_fd)
    return n


def write_file(final: str, header: bytes, payload: Buffer, *, sync: str = "data") -> int:
    """:func:`write_file_at` by path (the directory of ``final`` must exist)."""
    d, base = os.path.split(final)
    dfd = os.open(d or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return write_file_at(dfd, base, header, payload, sync=sync)
    finally:
        os.close(dfd)


def write_chunk(
    root: str,
    namespace: str,
    key: bytes,
    payload: Buffer,
    *,
    retention: int = 3,
    sync: str = "data",
    algo: int | None = None,
) -> str:
    """Write one chunk file under ``root`` the way the daemon does; returns its path."""
    header = make_header(namespace, key, payload, retention=retention, algo=algo)
    digest = header.namespace_digest
    ensure_dir(root, digest, key, namespace)
    path = os.path.join(root, relpath(digest, key))
    write_file(path, header.pack(), payload, sync=sync)
    return path
