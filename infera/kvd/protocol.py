"""The kvd wire protocol: length-prefixed msgpack frames over a Unix stream socket.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack encoding one map.
Requests carry ``op`` and ``id``; replies echo ``id`` and carry ``ok`` plus either the result
fields or ``error`` (a code from :data:`ERROR_CODES`) and ``message``. A request with
``noreply: true`` gets no reply (used for RELEASE, so a read costs one round trip).

Payload bytes never travel on the socket: they live in the shared-memory arena, whose file
descriptor the daemon passes at HELLO with SCM_RIGHTS. The full description is docs/protocol.md.

This module is part of the contract layer (docs/design.md, "Layers"): the daemon, the client, the
connector and every tool import it, so it imports nothing of ours. Besides the framing it holds the
two other facts both ends of the socket must agree on: where the socket is by default
(:func:`default_socket_path`) and how a client maps the arena it receives (:func:`map_arena`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import stat
import struct
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
MIN_PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
MAX_FRAME = 16 << 20
MAX_KEY_LEN = 64
MAX_BATCH = 65536

# Bounds on what one request may hold (docs/protocol.md, "Limits"). The largest legitimate frames
# are batches of MAX_BATCH keys (a PUT of 65,536 64-byte keys is about 4.6 MB; ADOPT with as many
# ``failed`` keys about 9 MB), so MAX_FRAME stays 16 MiB and these bound what decoding may build.
MAX_STR_LEN = 64 << 10  # any one string or byte string of a request, in bytes
MAX_ARRAY_LEN = 2 * MAX_BATCH  # any one array (a batch one over MAX_BATCH still gets the plain error)
MAX_MAP_LEN = 1024  # entries of any one map
MAX_CONTAINERS = 64  # arrays and maps in one request (the real ones have at most 4)
MAX_ITEMS = 4 * MAX_BATCH  # elements of all arrays and maps of one request together
CHECKED_BODY = 64 << 10  # bodies above this are decoded with the container budget

# HELLO and REPORT fields, in characters. Identities (namespace, hash fingerprint, hash settings)
# over their bound are refused with ``bad_request``; what is only displayed is cut to its bound
# (name, role, model, data paths, fallback reasons; counters past the first MAX_REPORT_COUNTERS or
# with longer names are left out and counted). STATS lists at most snapshot.STATS_MAX_CLIENTS
# clients, so its reply always fits MAX_FRAME.
MAX_NAMESPACE_LEN = 1024
MAX_NAMESPACES_PER_CONN = 8  # distinct namespaces one connection may say HELLO with
MAX_TEXT_LEN = 256  # name, role, model, data_path of HELLO (cut)
MAX_PID = (1 << 31) - 1  # HELLO pid: a pid_t, positive
MAX_CHUNK_TOKENS = (1 << 31) - 1  # HELLO chunk_tokens: positive
MAX_FINGERPRINT_LEN = 128
MAX_HASH_SETTINGS = 16  # keys of hash_settings; values are scalars, strings up to MAX_TEXT_LEN
MAX_SETTING_NAME_LEN = 64
MAX_REPORT_COUNTERS = 128  # an engine worker reports about 60
MAX_COUNTER_NAME_LEN = 64
MAX_REPORT_TEXT = 500  # data_path, fallback_reason, requested_path of REPORT (cut)

OPS = (
    "HELLO",
    "PUT",
    "SEAL",
    "ABORT",
    "GET",
    "RELEASE",
    "LOOKUP",
    "DELETE",
    "STATS",
    "PREWARM",
    "REPORT",
    "PING",
    "ADOPT",
)

# Typed error codes a reply may carry.
ERROR_CODES = (
    "bad_request",  # malformed message, wrong types, bad key
    "unknown_op",
    "version",  # no common protocol version
    "refused",  # peer uid not allowed
    "full",  # arena cannot hold the chunk even after eviction
    "quota",  # the connection already pins its share of the arena (--client-quota)
    "busy",  # another writer holds a reservation for this key
    "exists",  # key already sealed (PUT without overwrite)
    "unsupported",  # feature not enabled on this daemon (e.g. PREWARM without a long tier)
    "too_large",
    "internal",
)

RETENTIONS = ("none", "ephemeral", "short", "long")
RETENTION_CODE = {name: i for i, name in enumerate(RETENTIONS)}


def encode(msg: dict[str, Any]) -> bytes:
    """Encode one message as a complete frame (header + body)."""
    body = msgpack.packb(msg, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes | memoryview) -> Any:
    """Decode one frame body; raises ValueError (or a msgpack error) on garbage."""
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


class RequestTooComplex(ValueError):
    """A request holding more arrays, maps or elements than any real request does."""


class RequestDecoder:
    """The daemon's decoder of request bodies, bounded so one frame cannot amplify memory.

    msgpack spends one byte on an empty array, which Python turns into a 64-byte list: a 16 MiB
    frame of them once cost 1.25 GB and a 4 s freeze. Big bodies are decoded with per-object limits
    (``max_*_len``, native) and a count of containers and elements over the whole request (a hook
    called once per array or map). A body of at most :data:`CHECKED_BODY` bytes cannot build more
    than a few MB whatever it holds, so the hot path (small requests, a 1000-key LOOKUP) is decoded
    exactly as before, at no extra cost.

    Not thread-safe: the daemon decodes on its loop thread only.
    """

    __slots__ = ("_containers", "_items")

    def __init__(self) -> None:
        self._containers = 0
        self._items = 0

    def _count(self, obj: Any) -> Any:
        self._containers += 1
        self._items += len(obj)
        if self._containers > MAX_CONTAINERS or self._items > MAX_ITEMS:
            raise RequestTooComplex(
                f"a request may hold at most {MAX_CONTAINERS} arrays and maps and {MAX_ITEMS} elements in all"
            )
        return obj

    def decode(self, body: bytes | memoryview) -> Any:
        """Decode one request body; raises ValueError (or a msgpack error) on garbage or excess."""
        if len(body) <= CHECKED_BODY:  # cannot build more than a few MB: decoded as before
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        self._containers = self._items = 0
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,
            max_str_len=MAX_STR_LEN,
            max_bin_len=MAX_STR_LEN,
            max_array_len=MAX_ARRAY_LEN,
            max_map_len=MAX_MAP_LEN,
            max_ext_len=0,
            list_hook=self._count,
            object_hook=self._count,
        )


class FrameTooLarge(Exception):
    """A peer announced a frame above the cap; the stream cannot be trusted any more."""


class FrameReader:
    """Incremental splitter of a byte stream into frame bodies."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self.pending = 0  # bytes of an incomplete frame held (a plain attribute: read per recv)

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        """Append ``data``; return every complete frame body now available."""
        self._buf += data
        out: list[bytes] = []
        buf = self._buf
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (length,) = HEADER.unpack_from(buf, pos)
            if length > self._max:
                raise FrameTooLarge(f"frame of {length} bytes exceeds the {self._max}-byte cap")
            if n - pos - 4 < length:
                break
            if length <= CHECKED_BODY:
                out.append(bytes(buf[pos + 4 : pos + 4 + length]))
            else:  # one copy, not two: a big frame would briefly cost three times its size
                with memoryview(buf) as view:
                    out.append(bytes(view[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        if pos:
            del buf[:pos]
        self.pending = len(buf)
        return out


def check_key(key: Any) -> bytes:
    """Return ``key`` if it is a valid chunk key (1 to 64 bytes), else raise ValueError."""
    if not isinstance(key, bytes | bytearray):
        raise ValueError(f"key must be bytes, not {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_LEN:
        raise ValueError(f"key must be 1 to {MAX_KEY_LEN} bytes long (got {len(key)})")
    return bytes(key)


_PEERCRED = struct.Struct("3i")


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    pid, uid, gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid, gid


def default_socket_path() -> str:
    """``$INFERA_KVD_SOCKET``, else ``$XDG_RUNTIME_DIR/infera-kvd.sock``, else a per-user /tmp path."""
    env = os.environ.get("INFERA_KVD_SOCKET")
    if env:
        return env
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "infera-kvd.sock")
    return f"/tmp/infera-kvd-{os.getuid()}/kvd.sock"


# What a client requires of a received arena: its size sealed (the daemon seals it at creation).
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class ArenaFdError(Exception):
    """A received arena descriptor is unusable (the client turns this into its own error type)."""


def check_arena_fd(fd: int, size: int) -> None:
    """Check a received arena before mapping it: a memfd whose size is sealed, at least ``size``
    bytes long. An unsealed one could be shrunk under us (SIGBUS on the next access); only a
    fake or outdated daemon sends one. One fstat and one fcntl."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise ArenaFdError(f"cannot stat it: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ArenaFdError("it is not a memory file")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise ArenaFdError("it is not a sealable memfd (its size could change under this client)") from None
    if seals & SIZE_SEALS != SIZE_SEALS:
        raise ArenaFdError("its size is not sealed (anyone holding it could shrink it under this client)")
    if st.st_size < size:
        raise ArenaFdError(f"it holds {st.st_size} bytes, fewer than the {size} announced")


def map_arena(fd: int, size: int) -> mmap.mmap:
    """Map the arena whose descriptor arrived with the HELLO reply (client side, read and write);
    ArenaFdError if it is unusable."""
    check_arena_fd(fd, size)
    try:
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, OverflowError) as exc:
        raise ArenaFdError(
            f"cannot map {size} bytes of it: {getattr(exc, 'strerror', None) or exc}"
        ) from None
