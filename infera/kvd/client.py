"""``KvdClient``: the library engines, tools and users' scripts use to talk to a kvd daemon.

Reads and writes go through the shared arena: a ``put`` reserves a region, copies the bytes into
the mapped arena and seals it; a ``get`` leases a region, copies it out and releases the lease
(the release rides along without waiting for a reply, so a read costs one round trip).

The client is thread-safe (one lock around each request) and raises only :class:`KvdClientError`
subclasses.

What the client verifies before it trusts a daemon (one ``getsockopt`` and one ``fstat`` plus one
``fcntl`` on top of the connect and HELLO round trip):

* **who listens** (``SO_PEERCRED``, right after connect, before any byte is sent): the listener's
  uid must be this process's own uid, root, or one of ``trust_uids=`` / ``$INFERA_KVD_TRUST_UID``
  (comma-separated uids or user names). Anything else is :class:`KvdUntrusted`: another local
  user's socket at a predictable path would otherwise receive every stored chunk and feed back
  bytes of its choosing.
* **the arena** passed at HELLO: a memfd whose size is sealed (``F_SEAL_SHRINK | F_SEAL_GROW``,
  read with ``F_GET_SEALS``), at least as large as the announced ``arena_size``, and mappable.
  An unsealed descriptor could be shrunk under the mapping (SIGBUS on the next access); only a
  fake or outdated daemon sends one. Any failure is :class:`KvdArenaError`.
* **a full accept queue** is not a failure: a connect refused with EAGAIN (hundreds of engines
  connecting in one busy second, or a daemon paused for a moment) is retried with a short
  backoff until ``timeout``. ECONNREFUSED (nobody listens) fails at once.

It does not check the bytes a trusted daemon serves: every client the daemon serves can write
the whole arena (docs/daemon.md, "Security model").
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from infera.errors import KvdError
from infera.kvd import protocol as P
from infera.kvd.protocol import ArenaFdError, default_socket_path, map_arena

Buffer = bytes | bytearray | memoryview


class KvdClientError(KvdError):
    """Base of every error the client raises."""


class KvdUnavailable(KvdClientError):
    """The daemon cannot be reached (not running, wrong socket, connection lost)."""


class KvdRefused(KvdClientError):
    """The daemon refused this process (its uid is not allowed)."""


class KvdProtocolError(KvdClientError):
    """The daemon answered with something this client does not understand, or a typed error."""

    def __init__(self, message: str, code: str = "bad_request", hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.code = code


class KvdFull(KvdClientError):
    """The arena cannot hold the chunk even after evicting everything evictable."""


class KvdUnsupported(KvdProtocolError):
    """The daemon does not offer this feature in its current configuration."""


class KvdUntrusted(KvdClientError):
    """The process listening on the socket runs as a uid this client does not trust."""


class KvdArenaError(KvdClientError):
    """The arena descriptor the daemon passed at HELLO is unusable (unsealed, short, unmappable)."""


TRUST_ENV = "INFERA_KVD_TRUST_UID"
_PEERCRED = struct.Struct("3i")
CONNECT_BACKOFF_MAX_S = 0.05  # longest pause between two connect attempts on a full accept queue


def _env_trust_uids() -> set[int]:
    """``$INFERA_KVD_TRUST_UID``: uids or user names, comma-separated (read at each connect)."""
    raw = os.environ.get(TRUST_ENV, "")
    uids: set[int] = set()
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        if item.isdigit():
            uids.add(int(item))
            continue
        import pwd

        try:
            uids.add(pwd.getpwnam(item).pw_uid)
        except KeyError:
            raise KvdClientError(
                f"{TRUST_ENV}: {item!r} is not a uid or a user name", hint=f"e.g. {TRUST_ENV}=0,1001"
            ) from None
    return uids


def _connect(path: str, timeout: float | None) -> socket.socket:
    """Connect, retrying while the daemon's accept queue is full (EAGAIN) until ``timeout``.

    A Unix socket refuses a connect at once with EAGAIN when the listener's backlog is full,
    however long the timeout: a busy second (hundreds of engines starting together) or a daemon
    paused for a moment would fail them all. ECONNREFUSED means nobody listens: no retry."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:  # EAGAIN: the accept queue is full
            sock.close()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise KvdUnavailable(
                    f"kvd at {path} did not accept the connection in time (its accept queue stayed full)",
                    hint="the daemon is overloaded or stopped; `kvd stat --socket PATH` checks",
                ) from None
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, CONNECT_BACKOFF_MAX_S)
        except FileNotFoundError:
            sock.close()
            raise KvdUnavailable(
                f"no kvd daemon at {path} (socket file not found)",
                hint="start one with `kvd serve --socket PATH`, or set INFERA_KVD_SOCKET",
            ) from None
        except OSError as exc:
            sock.close()
            raise KvdUnavailable(
                f"cannot connect to kvd at {path}: {exc.strerror or exc}",
                hint="is the daemon running? `kvd stat --socket PATH` checks",
            ) from None


def _check_peer(sock: socket.socket, path: str, trust_uids: Iterable[int] | None) -> None:
    """Refuse a listener run by an untrusted uid, before any byte is sent to it.

    Trusted: this process's own uid, root, ``trust_uids`` and ``$INFERA_KVD_TRUST_UID``. Anyone
    else could have put a fake daemon at a predictable path: it would receive every chunk this
    client stores and feed it bytes of its choosing."""
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    if uid in (0, os.geteuid(), os.getuid()):
        return
    if trust_uids is not None and uid in set(trust_uids):
        return
    if uid in _env_trust_uids():
        return
    raise KvdUntrusted(
        f"the process listening on {path} runs as uid {uid}, which this client does not trust",
        hint=f"if that uid runs your kvd daemon, set {TRUST_ENV}={uid} (or pass trust_uids); "
        "otherwise someone else put a socket there",
    )


def _default_spin() -> float:
    """Seconds a client polls for a reply before blocking: ``$INFERA_KVD_SPIN_US`` (default 0: off)."""
    try:
        return max(0, min(int(os.environ.get("INFERA_KVD_SPIN_US", "0")), 100_000)) / 1e6
    except ValueError:
        return 0.0


def _err(reply: dict[str, Any]) -> KvdClientError:
    code = reply.get("error", "internal")
    message = reply.get("message", code)
    if code == "refused":
        return KvdRefused(message, hint="start the daemon with --allow-uid for this user")
    if code in ("full", "too_large"):
        return KvdFull(message)
    if code == "unsupported":
        return KvdUnsupported(message, code)
    return KvdProtocolError(message, code)


class KvdClient:
    """A connection to one kvd daemon.

    ``namespace`` scopes every key: two clients with different namespaces never see each other's
    chunks. ``model``, ``role`` and ``hash_settings`` are declared at HELLO so the daemon (and
    ``kvd stat``, ``kvd top``, ``kvd doctor``) can say who is connected and whether engines of one
    model agree on hashing. ``trust_uids`` adds uids whose daemons this client accepts (besides its
    own uid, root and ``$INFERA_KVD_TRUST_UID``): see the module docstring.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        namespace: str = "",
        name: str | None = None,
        role: str = "client",
        model: str | None = None,
        hash_settings: dict[str, Any] | None = None,
        hash_fingerprint: str | None = None,
        chunk_tokens: int | None = None,
        kv_layout: dict[str, Any] | None = None,
        want_arena: bool = True,
        timeout: float | None = 30.0,
        spin_us: int | None = None,
        trust_uids: Iterable[int] | None = None,
    ) -> None:
        self.socket_path = os.fspath(socket_path) if socket_path is not None else default_socket_path()
        self.namespace = namespace
        self._lock = threading.Lock()
        self._next_id = 1
        self._reader = P.FrameReader()
        self._pending: list[bytes] = []
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._sock: socket.socket | None = None
        self._spin = spin_us / 1e6 if spin_us is not None else _default_spin()
        self.arena_size = 0
        self.server_version = ""
        self.long_tier: str | None = None
        self.long_path: str | None = None
        self.client_id = 0
        sock = _connect(self.socket_path, timeout)
        try:
            _check_peer(sock, self.socket_path, trust_uids)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        hello: dict[str, Any] = {
            "op": "HELLO",
            "versions": [P.PROTOCOL_VERSION],
            "name": name or os.path.basename(sys.argv[0] or "python"),
            "pid": os.getpid(),
            "namespace": namespace,
            "role": role,
            "want_arena": want_arena,
        }
        for field, value in (
            ("model", model),
            ("hash_settings", hash_settings),
            ("hash_fingerprint", hash_fingerprint),
            ("chunk_tokens", chunk_tokens),
            ("kv_layout", kv_layout),
        ):
            if value is not None:
                hello[field] = value
        fds: list[int] = []
        try:
            reply, fds = self._call(hello, want_fds=True)
            if not reply.get("ok"):
                raise _err(reply)
            self._accept_hello(reply, fds, want_arena)
        except BaseException:
            self.close()
            raise
        finally:
            for fd in fds:  # mapped (or refused) by now: the mapping keeps the memory alive
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _accept_hello(self, reply: dict[str, Any], fds: list[int], want_arena: bool) -> None:
        size = reply.get("arena_size")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise KvdProtocolError(f"daemon announced an arena size of {size!r}, not a positive integer")
        self.arena_size = size
        self.server_version = str(reply.get("server_version", ""))
        self.long_tier = reply.get("long_tier")
        self.long_path = reply.get("long_path")
        client_id = reply.get("client_id", 0)
        self.client_id = client_id if isinstance(client_id, int) else 0
        if want_arena:
            if not fds:
                raise KvdProtocolError("daemon did not pass the arena descriptor at HELLO")
            try:
                self._map = map_arena(fds[0], size)
            except ArenaFdError as exc:
                raise KvdArenaError(
                    f"the arena descriptor from {self.socket_path} is unusable: {exc}",
                    hint="is this a kvd daemon of this version? restart it, or check what listens there",
                ) from None
            self._view = memoryview(self._map)

    # -- plumbing ---------------------------------------------------------------------------
    def _recv_frame(self, want_fds: bool) -> tuple[dict[str, Any], list[int]]:
        sock = self._sock
        if sock is None:
            raise KvdUnavailable("client is closed")
        fds: list[int] = []
        if not want_fds and not self._pending and self._spin:
            # Poll briefly before blocking: replies usually come within tens of microseconds,
            # and a blocked reader pays an idle-CPU wake-up on top (costly on virtual machines).
            deadline = time.perf_counter() + self._spin
            while True:
                try:
                    data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    if time.perf_counter() < deadline:
                        continue
                    break
                except OSError as exc:
                    raise KvdUnavailable(f"connection to kvd lost: {exc.strerror or exc}") from None
                if not data:
                    raise KvdUnavailable(f"kvd at {self.socket_path} closed the connection")
                try:
                    self._pending.extend(self._reader.feed(data))
                except P.FrameTooLarge as exc:
                    raise KvdProtocolError(str(exc)) from None
                if self._pending:
                    break
        while not self._pending:
            try:
                if want_fds:
                    data, got, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
                    fds.extend(got)
                else:
                    data = sock.recv(1 << 16)
            except TimeoutError:
                raise KvdUnavailable(f"kvd at {self.socket_path} did not answer in time") from None
            except OSError as exc:
                raise KvdUnavailable(f"connection to kvd lost: {exc.strerror or exc}") from None
            if not data:
                raise KvdUnavailable(f"kvd at {self.socket_path} closed the connection")
            try:
                self._pending.extend(self._reader.feed(data))
            except P.FrameTooLarge as exc:
                raise KvdProtocolError(str(exc)) from None
        body = self._pending.pop(0)
        problem = ""
        try:
            msg = P.decode_body(body)
        except Exception:
            problem = "daemon sent a frame that is not valid msgpack"
        else:
            if not isinstance(msg, dict):
                problem = "daemon sent a reply that is not a map"
        if problem:
            for fd in fds:  # never leak descriptors that came with a reply we refuse
                os.close(fd)
            raise KvdProtocolError(problem)
        return msg, fds

    def _call(self, msg: dict[str, Any], want_fds: bool = False) -> tuple[dict[str, Any], list[int]]:
        rid = self._next_id
        self._next_id += 1
        msg["id"] = rid
        try:
            self._send(msg)
        except KvdUnavailable as lost:
            # The daemon may have said why before closing (e.g. uid refused): prefer its words.
            try:
                return self._recv_frame(want_fds)
            except KvdClientError:
                raise lost from None
        while True:
            reply, fds = self._recv_frame(want_fds)
            if reply.get("id") == rid or reply.get("id") == 0:
                return reply, fds
            for fd in fds:  # a stray reply: never expected, never leak descriptors
                os.close(fd)

    def _send(self, msg: dict[str, Any]) -> None:
        if self._sock is None:
            raise KvdUnavailable("client is closed")
        try:
            self._sock.sendall(P.encode(msg))
        except OSError as exc:
            raise KvdUnavailable(f"connection to kvd lost: {exc.strerror or exc}") from None

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply map; typed errors become exceptions."""
        with self._lock:
            reply, _ = self._call({"op": op, **fields})
        if not reply.get("ok"):
            raise _err(reply)
        return reply

    def notify(self, op: str, **fields: Any) -> None:
        """Send a request that gets no reply (RELEASE, REPORT)."""
        with self._lock:
            self._send({"op": op, "noreply": True, **fields})

    @property
    def arena(self) -> memoryview:
        if self._view is None:
            raise KvdClientError("this client was opened with want_arena=False")
        return self._view

    # -- public API -------------------------------------------------------------------------
    def put(self, key: bytes, data: Buffer, retention: str = "long", overwrite: bool = False) -> bool:
        """Store ``data`` under ``key``. Returns False when nothing was stored (``none``
        retention, or the key is already present / being written and ``overwrite`` is False).
        Raises KvdFull when the arena cannot make room.

        One round trip: the seal is sent without waiting for its reply. The chunk is visible to
        every request the daemon reads after the seal, which includes every later request of
        this client; a request another process sends at the same instant may still miss it."""
        return self.put_many([(key, data)], retention=retention, overwrite=overwrite)[0]

    def put_many(
        self, items: Sequence[tuple[bytes, Buffer]], retention: str = "long", overwrite: bool = False
    ) -> list[bool]:
        """Store several chunks with one round trip in all (reserve; the seal rides along)."""
        if retention not in P.RETENTION_CODE:
            raise ValueError(f"retention must be one of {', '.join(P.RETENTIONS)} (got {retention!r})")
        keys = [P.check_key(k) for k, _ in items]
        views = [memoryview(d).cast("B") for _, d in items]
        reply = self.request(
            "PUT", keys=keys, lengths=[v.nbytes for v in views], retention=retention, overwrite=overwrite
        )
        slots = reply.get("slots", [])
        arena = self.arena
        tokens: list[int] = []
        stored: list[bool] = []
        full_error: str | None = None
        for slot, view in zip(slots, views, strict=True):
            if isinstance(slot, list):
                token, off = slot
                arena[off : off + view.nbytes] = view
                tokens.append(token)
                stored.append(True)
            else:
                if slot in ("full", "too_large"):
                    full_error = slot
                stored.append(False)
        if tokens:
            self.notify("SEAL", tokens=tokens)
        if full_error is not None and not any(stored):
            raise KvdFull(
                "the kvd arena is full (every chunk is leased or held)"
                if full_error == "full"
                else "the chunk is larger than the whole kvd arena",
                hint="raise --max-bytes, or release leases",
            )
        return stored

    def reserve(
        self,
        keys: Sequence[bytes],
        lengths: Sequence[int],
        retention: str = "long",
        overwrite: bool = False,
        persisted: bool = False,
    ) -> list[tuple[int, int] | str]:
        """Low-level: reserve regions; each slot is ``(token, offset)`` or a reason string.
        Fill ``client.arena[offset:offset+length]`` and then :meth:`seal` the tokens.
        ``persisted``: this client writes the long-tier files itself and :meth:`adopt`s them."""
        fields: dict[str, Any] = {}
        if persisted:
            fields["persisted"] = True
        reply = self.request(
            "PUT",
            keys=[P.check_key(k) for k in keys],
            lengths=list(lengths),
            retention=retention,
            overwrite=overwrite,
            **fields,
        )
        return [tuple(s) if isinstance(s, list) else s for s in reply["slots"]]  # type: ignore[misc]

    def seal(self, tokens: Sequence[int], wait: bool = True) -> None:
        if not tokens:
            return
        if wait:
            self.request("SEAL", tokens=list(tokens))
        else:
            self.notify("SEAL", tokens=list(tokens))

    def abort(self, tokens: Sequence[int]) -> None:
        if tokens:
            self.notify("ABORT", tokens=list(tokens))

    def get(self, key: bytes) -> bytes | None:
        """Return a copy of the chunk stored under ``key``, or None."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        leases = self.lease([P.check_key(k) for k in keys])
        arena = self.arena
        out: list[bytes | None] = []
        tokens: list[int] = []
        for item in leases:
            if item is None:
                out.append(None)
                continue
            token, off, length = item
            out.append(bytes(arena[off : off + length]))
            tokens.append(token)
        self.release(tokens)
        return out

    def get_into(self, key: bytes, buffer: Buffer) -> int | None:
        """Copy the chunk under ``key`` into ``buffer`` (no intermediate copy). Returns the
        number of bytes written, or None on a miss. A buffer smaller than the chunk is a
        ValueError (nothing is written)."""
        target = memoryview(buffer).cast("B")
        if target.readonly:
            raise ValueError("get_into needs a writable buffer")
        (item,) = self.lease([P.check_key(key)])
        if item is None:
            return None
        token, off, length = item
        try:
            if length > target.nbytes:
                raise ValueError(f"buffer of {target.nbytes} bytes is too small for a {length}-byte chunk")
            target[:length] = self.arena[off : off + length]
        finally:
            self.release([token])
        return length

    def lease(self, keys: Sequence[bytes], ram_only: bool = False) -> list[tuple[int, int, int] | None]:
        """Low-level: lease chunks; each item is ``(lease, offset, length)`` or None. The region
        stays valid until :meth:`release`. ``ram_only``: chunks only the long tier holds come
        back as None instead of being read into RAM (the caller reads them itself)."""
        reply = self.request("GET", keys=list(keys), **({"ram_only": True} if ram_only else {}))
        return [tuple(i) if i is not None else None for i in reply["items"]]  # type: ignore[misc]

    def release(self, leases: Iterable[int]) -> None:
        tokens = list(leases)
        if tokens:
            self.notify("RELEASE", leases=tokens)

    def lookup(self, keys: Sequence[bytes], hold_ms: int = 0) -> int:
        """How many of ``keys`` are present, counting from the first (stops at the first miss).
        ``hold_ms`` protects the found chunks from eviction for that long."""
        if not keys:
            return 0
        reply = self.request("LOOKUP", keys=[P.check_key(k) for k in keys], hold_ms=hold_ms)
        return int(reply["count"])

    def delete(self, keys: Sequence[bytes]) -> int:
        if not keys:
            return 0
        return int(self.request("DELETE", keys=[P.check_key(k) for k in keys])["deleted"])

    def prewarm(self, keys: Sequence[bytes]) -> int:
        """Ask the daemon to pull these chunks from the long tier into RAM in the background."""
        return int(self.request("PREWARM", keys=[P.check_key(k) for k in keys])["queued"])

    def adopt(
        self, keys: Sequence[bytes], lengths: Sequence[int], failed: Sequence[bytes] = ()
    ) -> dict[str, int]:
        """Tell the disk tier about chunk files this client wrote under its path (GPU-direct);
        ``failed`` are chunks reserved with ``persisted`` that could not be written."""
        reply = self.request(
            "ADOPT",
            keys=[P.check_key(k) for k in keys],
            lengths=list(lengths),
            failed=[P.check_key(k) for k in failed],
        )
        return {
            "adopted": int(reply.get("adopted", 0)),
            "written_through": int(reply.get("written_through", 0)),
        }

    def stats(self) -> dict[str, Any]:
        return dict(self.request("STATS")["stats"])

    def ping(self) -> bool:
        return bool(self.request("PING").get("pong"))

    def report(self, **report: Any) -> None:
        """Tell the daemon which data path this client uses, any fallback and its own counters."""
        self.notify("REPORT", report=report)

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            with contextlib.suppress(BufferError):
                view.release()
        mapped, self._map = self._map, None
        if mapped is not None:
            with contextlib.suppress(BufferError):
                mapped.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> KvdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


__all__ = [
    "KvdArenaError",
    "KvdClient",
    "KvdClientError",
    "KvdFull",
    "KvdProtocolError",
    "KvdRefused",
    "KvdUnavailable",
    "KvdUnsupported",
    "KvdUntrusted",
]
