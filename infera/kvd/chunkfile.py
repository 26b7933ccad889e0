"""The long tier's chunk file: a self-describing, checksummed file per chunk.

One file holds one chunk: a 4 KiB header, then the payload at offset 4096, so the payload starts
on a page boundary and can be read with O_DIRECT, cuFile or hipFile straight into aligned memory.
The header is enough to validate the file without asking the daemon: magic, format version,
checksum algorithm, namespace digest, key, payload length and payload checksum, itself protected
by a header checksum. docs/chunk-format.md is the reference; this module is the implementation
the daemon, the benchmarks and (later) the connector's GPU-direct path share.

Where a chunk lives is a pure function of (namespace, key)::

    <root>/v1/<ns16>/<fan>/<keyhex>.kvcache

``ns16`` is the first 8 bytes (16 hex digits) of the namespace digest, ``fan`` is one byte of a
digest of the key (256 subdirectories per namespace), ``keyhex`` the key in lowercase hex. A
writer creates the file under a temporary name starting with ``.`` in the same directory and
renames it into place, so a reader never sees a partial file under a chunk name. Every file the
writers create is opened relative to a directory descriptor with ``O_CREAT | O_EXCL | O_NOFOLLOW``
under a random temporary name, and the directories on the way are opened with ``O_NOFOLLOW``: a
symbolic link planted in the tree is never followed (see :func:`open_dir_at`).
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:  # xxhash is a base dependency; the fallback only keeps a broken install readable
    import xxhash

    _xxh3_64: Callable[[Any], int] | None = xxhash.xxh3_64_intdigest
except ImportError:  # pragma: no cover - exercised only without the wheel
    _xxh3_64 = None

MAGIC = b"KVDCHUNK"
FORMAT_VERSION = 1
HEADER_SIZE = 4096
EXT = ".kvcache"
VERSION_DIR = f"v{FORMAT_VERSION}"
NAMESPACE_FILE = "namespace"
NS_PREFIX_LEN = 8  # bytes of the namespace digest that name its directory (infera.kvd.keyspace)
QUARANTINE_DIR = "quarantine"
TMP_SUFFIX = ".tmp"

# Checksum algorithm ids. 0 is never valid; ids are never reused for another algorithm.
ALGO_XXH3_64 = 1  # xxHash XXH3, 64-bit, seed 0 (default: ~20 GB/s on one core)
ALGO_CRC32 = 2  # zlib CRC-32 (ISO-HDLC); needs nothing outside the standard library
ALGO_WSUM31 = 3  # position-weighted sums of 16-bit words mod 2^31-1: computable on a GPU
ALGO_NAMES = {ALGO_XXH3_64: "xxh3-64", ALGO_CRC32: "crc32", ALGO_WSUM31: "wsum31"}
WSUM_MOD = (1 << 31) - 1
WSUM_PIECE = 1 << 17  # 16-bit words per piece: (i + 1) * h_i summed over a piece stays < 2^63

# magic, version, header size, algo, retention, flags, payload length, payload checksum (16 bytes,
# little-endian, zero padded), created (ns since the epoch), namespace digest, key length, key,
# namespace text length; the namespace text follows; the header checksum sits in the last 8 bytes.
_FIXED = struct.Struct("<8sHHHBBQ16sQ32sB64sH")
_HCHECK = struct.Struct("<Q")
HCHECK_OFFSET = HEADER_SIZE - _HCHECK.size
NS_TEXT_MAX = HCHECK_OFFSET - _FIXED.size
FLAG_NS_TRUNCATED = 1
MAX_KEY = 64

Buffer = bytes | bytearray | memoryview


class ChunkFileError(Exception):
    """A chunk file that cannot be used. ``corrupt`` says whether it should be quarantined."""

    corrupt = True


class CorruptChunk(ChunkFileError):
    """Truncated, checksum mismatch, wrong key: the bytes cannot be trusted."""


class OtherVersion(ChunkFileError):
    """A well-formed file of another format version or checksum algorithm: leave it alone."""

    corrupt = False


class NotRegular(ChunkFileError):
    """A symbolic link, directory, FIFO or device under a chunk name: never opened or trusted."""

    corrupt = False


class SizeChanged(ChunkFileError):
    """The file is not the size the caller expected (rewritten meanwhile): not corrupt."""

    corrupt = False

    def __init__(self, size: int) -> None:
        super().__init__(f"file is now {size} bytes")
        self.size = size


def default_algo() -> int:
    return ALGO_XXH3_64 if _xxh3_64 is not None else ALGO_CRC32


def checksum(algo: int, data: Buffer) -> int:
    """The payload checksum of ``data`` under algorithm ``algo`` (raises OtherVersion if unknown)."""
    if algo == ALGO_XXH3_64 and _xxh3_64 is not None:
        return _xxh3_64(data)
    if algo == ALGO_CRC32:
        return zlib.crc32(data)
    if algo == ALGO_WSUM31:
        return wsum31(data)
    raise OtherVersion(f"unknown checksum algorithm id {algo}")


def wsum_combine(s1: int, s2: int) -> int:
    return (s1 % WSUM_MOD) << 32 | (s2 % WSUM_MOD)


def wsum31(data: Buffer) -> int:
    """Checksum id 3 (docs/chunk-format.md): the payload as little-endian 16-bit words ``h_i``
    (a zero byte pads an odd length), ``S1 = sum(h_i)`` and ``S2 = sum((i + 1) * h_i)``, both mod
    2^31 - 1, packed as ``S1 << 32 | S2``. Every product and partial sum fits in 64 bits, so the
    GPU (torch, ``infera.engine.vllm.worker.gpu.gpudirect``) and the CPU (numpy here) agree exactly."""
    view = memoryview(data).cast("B")
    if view.nbytes % 2:
        view = memoryview(bytes(view) + b"\0")
    try:  # numpy is ~30x faster, even for a 4 KiB header (checked at every index rebuild)
        import numpy as np
    except ImportError:
        words = view.cast("H") if _little_endian() and view.nbytes <= 1 << 16 else None
        if words is None:
            raise OtherVersion("checksum wsum31 over large payloads needs numpy") from None
        s1 = sum(words)
        s2 = sum((i + 1) * h for i, h in enumerate(words))
        return wsum_combine(s1, s2)
    words_np = np.frombuffer(view, dtype="<u2")
    w0 = np.arange(1, WSUM_PIECE + 1, dtype=np.int64)
    s1 = s2 = 0
    for start in range(0, words_np.size, WSUM_PIECE):
        # sum((start + j + 1) * h_j) = start * sum(h) + sum((j + 1) * h_j): pieces of 2^17 words
        # keep every partial sum below 2^63
        h = words_np[start : start + WSUM_PIECE].astype(np.int64)
        total = int(h.sum())
        s1 += total
        s2 += start * total + int(np.dot(w0[: h.size], h))
    return wsum_combine(s1, s2)


def _little_endian() -> bool:
    import sys

    return sys.byteorder == "little"


# -- naming ---------------------------------------------------------------------------------
def ns_digest(namespace: str) -> bytes:
    """The 32-byte namespace digest stored in headers (BLAKE2b-256 of the UTF-8 text)."""
    return hashlib.blake2b(namespace.encode(), digest_size=32).digest()


def ns_dirname(digest: bytes) -> str:
    return digest[:NS_PREFIX_LEN].hex()


def fan_dirname(key: bytes) -> str:
    return hashlib.blake2b(key, digest_size=1).hexdigest()


def file_name(key: bytes) -> str:
    return key.hex() + EXT


def relpath(digest: bytes, key: bytes) -> str:
    """Path of a chunk file under the tier root, from the namespace digest and the key."""
    return os.path.join(VERSION_DIR, ns_dirname(digest), fan_dirname(key), file_name(key))


def chunk_path(root: str, namespace: str, key: bytes) -> str:
    """Where the chunk (namespace, key) lives under ``root``: no daemon needed to find it."""
    return os.path.join(root, relpath(ns_digest(namespace), key))


def key_from_name(name: str) -> bytes | None:
    """The key encoded in a chunk file name, or None for anything else (temp files included)."""
    if not name.endswith(EXT) or name.startswith("."):
        return None
    stem = name[: -len(EXT)]
    if not stem or len(stem) > 2 * MAX_KEY:
        return None
    try:
        return bytes.fromhex(stem)
    except ValueError:
        return None


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


# -- header ---------------------------------------------------------------------------------
@dataclass
class ChunkHeader:
    key: bytes
    namespace_digest: bytes
    payload_length: int
    payload_checksum: int
    algo: int = ALGO_XXH3_64
    retention: int = 3  # protocol code of "long"
    created_ns: int = 0
    namespace: str = ""
    flags: int = 0
    version: int = FORMAT_VERSION

    def pack(self) -> bytes:
        """The 4096-byte header, header checksum included."""
        if not 1 <= len(self.key) <= MAX_KEY:
            raise ValueError("chunk keys are 1 to 64 bytes")
        text = self.namespace.encode()
        flags = self.flags & ~FLAG_NS_TRUNCATED
        if len(text) > NS_TEXT_MAX:
            text = text[:NS_TEXT_MAX].decode(errors="ignore").encode()
            flags |= FLAG_NS_TRUNCATED
        buf = bytearray(HEADER_SIZE)
        _FIXED.pack_into(
            buf,
            0,
            MAGIC,
            self.version,
            HEADER_SIZE,
            self.algo,
            self.retention,
            flags,
            self.payload_length,
            self.payload_checksum.to_bytes(16, "little"),
            self.created_ns,
            self.namespace_digest,
            len(self.key),
            self.key,
            len(text),
        )
        buf[_FIXED.size : _FIXED.size + len(text)] = text
        _HCHECK.pack_into(buf, HCHECK_OFFSET, checksum(self.algo, memoryview(buf)[:HCHECK_OFFSET]))
        return bytes(buf)

    @classmethod
    def unpack(cls, buf: Buffer) -> ChunkHeader:
        """Parse and validate a header (raises CorruptChunk or OtherVersion)."""
        if len(buf) < HEADER_SIZE:
            raise CorruptChunk(f"truncated header ({len(buf)} of {HEADER_SIZE} bytes)")
        (magic, version, hsize, algo, retention, flags, plen, csum, created, digest, klen, key, tlen) = (
            _FIXED.unpack_from(buf, 0)
        )
        if magic != MAGIC:
            raise CorruptChunk("bad magic: not a kvd chunk file")
        if version != FORMAT_VERSION:
            raise OtherVersion(f"chunk format version {version} (this daemon reads {FORMAT_VERSION})")
        if hsize != HEADER_SIZE:
            raise CorruptChunk(f"header size {hsize} is not {HEADER_SIZE}")
        (stored,) = _HCHECK.unpack_from(buf, HCHECK_OFFSET)
        if checksum(algo, memoryview(buf)[:HCHECK_OFFSET]) != stored:
            raise CorruptChunk("header checksum mismatch")
        if not 1 <= klen <= MAX_KEY or tlen > NS_TEXT_MAX:
            raise CorruptChunk("header fields out of range")
        text = bytes(buf[_FIXED.size : _FIXED.size + tlen]).decode(errors="replace")
        return cls(
            key=key[:klen],
            namespace_digest=digest,
            payload_length=plen,
            payload_checksum=int.from_bytes(csum, "little"),
            algo=algo,
            retention=retention,
            created_ns=created,
            namespace=text,
            flags=flags,
            version=version,
        )


def make_header(
    namespace: str | bytes,
    key: bytes,
    payload: Buffer,
    *,
    retention: int = 3,
    algo: int | None = None,
    namespace_text: str = "",
) -> ChunkHeader:
    """Build the header for ``payload`` (computes its checksum). ``namespace`` is the text or
    its precomputed 32-byte digest (then ``namespace_text`` is the text to record)."""
    algo = default_algo() if algo is None else algo
    if isinstance(namespace, str):
        digest, text = ns_digest(namespace), namespace
    else:
        digest, text = namespace, namespace_text
    return ChunkHeader(
        key=key,
        namespace_digest=digest,
        payload_length=memoryview(payload).nbytes,
        payload_checksum=checksum(algo, payload),
        algo=algo,
        retention=retention,
        created_ns=time.time_ns(),
        namespace=text,
    )


# -- writing --------------------------------------------------------------------------------
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_name(base: str) -> str:
    """A fresh temporary name for ``base`` in the same directory (random: nobody can plant a
    file under it ahead of time)."""
    return f".{base}.{os.urandom(8).hex()}{TMP_SUFFIX}"


def _skip_done(views: list[memoryview], n: int) -> None:
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
        _skip_done(views, n)
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


# -- reading --------------------------------------------------------------------------------
def _read_all(fd: int, bufs: list[memoryview]) -> int:
    views = [v for v in bufs if v.nbytes]
    pos = 0
    while views:
        n = os.preadv(fd, views, pos)
        if n <= 0:
            break
        pos += n
        _skip_done(views, n)
    return pos


_tls = threading.local()


def open_regular(name: str, *, dir_fd: int | None = None, direct: bool = False) -> int:
    """Open a chunk file for reading without following a symbolic link and without blocking on
    a FIFO; raises NotRegular unless it is a regular file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags | (os.O_DIRECT if direct else 0), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symbolic link; a socket
            raise NotRegular(f"{name}: not a regular file") from None
        if exc.errno == errno.EINVAL and direct:  # O_DIRECT refused: is it a regular file at all?
            os.close(open_regular(name, dir_fd=dir_fd))
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(f"{name}: not a regular file")
    return fd


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


__all__ = [
    "ALGO_CRC32",
    "ALGO_NAMES",
    "ALGO_WSUM31",
    "ALGO_XXH3_64",
    "EXT",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "NS_PREFIX_LEN",
    "ChunkFileError",
    "ChunkHeader",
    "CorruptChunk",
    "NotRegular",
    "OtherVersion",
    "SizeChanged",
    "checksum",
    "chunk_path",
    "ensure_dir",
    "ensure_dir_at",
    "key_from_name",
    "make_header",
    "ns_digest",
    "open_dir_at",
    "open_regular",
    "read_chunk",
    "read_header",
    "read_into",
    "relpath",
    "write_chunk",
    "write_file",
    "write_file_at",
]
