"""Reading chunk files: regular files only, into caller buffers (O_DIRECT where asked), verified."""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading

from infera.kvd.chunkfile.format import (
    ALGO_NAMES,
    HEADER_SIZE,
    CorruptChunk,
    NotRegular,
    SizeChanged,
    checksum,
)
from infera.kvd.chunkfile.header import ChunkHeader
from infera.kvd.chunkfile.write import skip_done


def _read_all(fd: int, bufs: list[memoryview]) -> int:
    views = [v for v in bufs if v.nbytes]
    pos = 0
    while views:
        n = os.preadv(fd, views, pos)
        if n <= 0:
            break
        pos += n
        skip_done(views, n)
    return pos


_tls = threading.local()


def open_regular(name: str, *, dir_fd: int | None = None, direct: bool = False) -> int:
    """Open a chunk file for reading without following a symbolic link and without blocking on
    a FIFO; raises NotRegular unless it is a regular file."""
    return open_regular_stat(name, dir_fd=dir_fd, direct=direct)[0]


def open_regular_stat(
    name: str, *, dir_fd: int | None = None, direct: bool = False
) -> tuple[int, os.stat_result]:
    """:func:`open_regular`, and the file's ``fstat`` (taken once, for the mode check)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags | (os.O_DIRECT if direct else 0), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symbolic link; a socket
            raise NotRegular(f"{name}: not a regular file") from None
        if exc.errno == errno.EINVAL and direct:  # O_DIRECT refused: is it a regular file at all?
            os.close(open_regular(name, dir_fd=dir_fd))
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(f"{name}: not a regular file")
    return fd, st


def _aligned_header() -> memoryview:
    """A page-aligned 4 KiB buffer per thread: O_DIRECT needs aligned memory for the header too."""
    buf = getattr(_tls, "header", None)
    if buf is None:
        buf = _tls.header = memoryview(mmap.mmap(-1, HEADER_SIZE))
    return buf


def read_into(
    path: str,
    target: memoryview,
    *,
    length: int | None = None,
    digest: bytes | None = None,
    key: bytes | None = None,
    direct: bool = False,
    drop_cache: bool = True,
) -> ChunkHeader:
    """Read the chunk at ``path`` into ``target`` and verify it; ``length`` is the payload length
    the caller expects (default: all of ``target``).

    ``direct`` reads with O_DIRECT, bypassing the page cache; ``target`` must then start on a
    page boundary and span ``length`` rounded up to 4 KiB (arena regions do). Raises
    FileNotFoundError when the file is gone, SizeChanged when its size is not ``HEADER_SIZE +
    length``, CorruptChunk / OtherVersion when it cannot be trusted, OSError(EINVAL) when the
    filesystem refuses O_DIRECT, NotRegular when ``path`` is a symbolic link, a FIFO, a directory
    or a device (it is never followed, and opening it never blocks)."""
    want = target.nbytes if length is None else length
    fd = open_regular(path, direct=direct)
    try:
        size = os.fstat(fd).st_size
        header_buf = _aligned_header() if direct else memoryview(bytearray(HEADER_SIZE))
        if size < HEADER_SIZE:
            raise CorruptChunk(f"truncated file ({size} bytes, shorter than the header)")
        if size != HEADER_SIZE + want:
            _read_all(fd, [header_buf])
            header = ChunkHeader.unpack(header_buf)
            if header.payload_length != size - HEADER_SIZE:
                raise CorruptChunk(
                    f"truncated file ({size - HEADER_SIZE} of {header.payload_length} payload bytes)"
                )
            raise SizeChanged(size)
        room = (want + HEADER_SIZE - 1) // HEADER_SIZE * HEADER_SIZE if direct else want
        got = _read_all(fd, [header_buf, target[:room]])
        if drop_cache and not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    header = ChunkHeader.unpack(header_buf)
    if got < size:
        raise CorruptChunk(f"file shrank while reading ({got} of {size} bytes)")
    if header.payload_length != want:
        raise CorruptChunk(f"header says {header.payload_length} payload bytes, file holds {want}")
    if key is not None and header.key != key:
        raise CorruptChunk("file holds another key than its name says")
    if digest is not None and header.namespace_digest != digest:
        raise CorruptChunk("file belongs to another namespace than its directory says")
    if checksum(header.algo, target[:want]) != header.payload_checksum:
        raise CorruptChunk(f"payload checksum mismatch ({ALGO_NAMES.get(header.algo, header.algo)})")
    return header


def read_chunk(
    path: str, *, digest: bytes | None = None, key: bytes | None = None
) -> tuple[ChunkHeader, bytes]:
    """Read and verify a whole chunk file; returns (header, payload). For tools and tests."""
    size = os.stat(path).st_size
    buf = bytearray(max(size - HEADER_SIZE, 0))
    header = read_into(path, memoryview(buf), digest=digest, key=key, drop_cache=False)
    return header, bytes(buf)


def read_header(path: str) -> ChunkHeader:
    """Parse and validate only the header of a chunk file (the payload is not checked)."""
    fd = open_regular(path)
    try:
        return ChunkHeader.unpack(os.pread(fd, HEADER_SIZE, 0))
    finally:
        os.close(fd)
