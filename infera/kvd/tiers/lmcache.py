"""``--long-backend lmcache``: the long tier is an ``lmcache_server`` (LMCache's standalone server).

For sites that already run one. The server is a single Python process holding every value in a
dict: no eviction, no memory limit, no delete, no persistence (a restart loses everything). We
speak its wire protocol with a plain socket; nothing from LMCache (or torch) is imported.

Protocol (native byte order, one TCP stream per client, requests answered strictly in order):

* request header, 186 bytes: ``iiiiiiiii150s`` = command, length, memory format, dtype,
  location, shape[4], key (padded with spaces to 150 bytes);
* commands PUT=1 (followed by ``length`` bytes, no reply), GET=2, EXIST=3, HEALTH=5;
* reply header, 36 bytes: ``iiiiiiiii`` = code (200 ok, 400 fail), length, format, dtype,
  shape[4], location; a successful GET is followed by ``length`` bytes.
* The key must parse as LMCache's ``model@world_size@worker_id@<hex hash>@dtype``; anything else
  makes the server drop the connection. Ours is ``<namespace prefix hex>@1@0@1<key hex>@uint8``
  (:func:`infera.kvd.keyspace.lmcache_name`).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera.kvd.keyspace import LMCACHE_NAME_MAX, lmcache_name
from infera.kvd.tiers.remote import RemoteTier
from infera.kvd.tiers.transport import HEADER, Region, Transport, TransportError

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.tiers.base import TierHost

REQUEST = struct.Struct("=iiiiiiiii150s")
REPLY = struct.Struct("=iiiiiiiii")
PUT, GET, EXIST, HEALTH = 1, 2, 3, 5
OK, FAIL = 200, 400
FMT_BINARY = 4
DTYPE_UINT8 = 6
MAX_KEY = LMCACHE_NAME_MAX  # the key field of REQUEST
IO_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 1.0


def parse_url(url: str) -> tuple[str, int]:
    rest = url[len("lm://") :] if url.startswith("lm://") else url
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


EXIST_SLICE = 128  # EXIST requests sent before their replies are read


def request(cmd: int, name: str, length: int = 0) -> bytes:
    return REQUEST.pack(
        cmd, length, FMT_BINARY, DTYPE_UINT8, 0, length, 0, 0, 0, name.encode().ljust(MAX_KEY)
    )


def recv_into(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("connection closed by lmcache_server")
        view = view[n:]


def abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0) instead of a FIN handshake."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def drain(sock: socket.socket, n: int) -> None:
    buf = bytearray(min(n, 1 << 20))
    while n:
        view = memoryview(buf)[: min(n, len(buf))]
        recv_into(sock, view)
        n -= view.nbytes


class LMCacheTransport(Transport):
    backend = "lmcache"

    def __init__(self, url: str) -> None:
        self.endpoint = url
        self.host, self.port = parse_url(url)
        self._local = threading.local()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._ok = False

    @property
    def connected(self) -> bool:
        return self._ok

    def _conn(self) -> socket.socket:
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is None or sock.fileno() < 0:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=IO_TIMEOUT_S)
            except OSError as exc:
                raise TransportError(f"cannot reach {self.endpoint}: {exc.strerror or exc}", "down") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.sock = sock
            with self._lock:
                self._socks.append(sock)
        return sock

    def _broken(self, exc: BaseException) -> TransportError:
        sock = getattr(self._local, "sock", None)
        self._local.sock = None
        if sock is not None:
            with self._lock:
                if sock in self._socks:
                    self._socks.remove(sock)
            abort(sock)
        return TransportError(f"lmcache_server connection lost: {exc}", "down")

    def _reply(self, sock: socket.socket) -> tuple[int, int]:
        buf = bytearray(REPLY.size)
        recv_into(sock, memoryview(buf))
        code, length = REPLY.unpack(buf)[:2]
        return code, length

    def probe(self) -> None:
        try:
            with socket.create_connection((self.host, self.port), timeout=PROBE_TIMEOUT_S) as s:
                s.sendall(request(HEALTH, "kvd@1@0@0@uint8"))
                code, _ = self._reply(s)
        except OSError as exc:
            raise TransportError(f"{self.endpoint} does not answer ({exc})", "down") from None
        if code != OK:
            raise TransportError(f"{self.endpoint} answered HEALTH with {code}", "down")

    def connect(self, arena: Region, slots: Region) -> None:
        self._ok = True

    def name(self, digest: bytes, key: bytes) -> str:
        return lmcache_name(digest, key)

    def exists(self, name: str) -> bool:
        sock = self._conn()
        try:
            sock.sendall(request(EXIST, name))
            code, _ = self._reply(sock)
        except OSError as exc:
            raise self._broken(exc) from None
        return code == OK

    def exists_many(self, names: list[str]) -> list[bool]:
        """The server has no batch call, but answers a connection's requests in order: send a
        slice of EXIST requests at once, then read their replies (one round trip per slice,
        not per key). Slices stay small enough that neither side's socket buffer fills."""
        out: list[bool] = []
        sock = self._conn()
        try:
            for i in range(0, len(names), EXIST_SLICE):
                part = names[i : i + EXIST_SLICE]
                sock.sendall(b"".join(request(EXIST, n) for n in part))
                for _ in part:
                    code, length = self._reply(sock)
                    if length:
                        recv_into(sock, memoryview(bytearray(length)))
                    out.append(code == OK)
        except OSError as exc:
            raise self._broken(exc) from None
        return out

    def fetch(self, name: str, header: Region, alloc: Callable[[int], Region | None]) -> Region | None:
        sock = self._conn()
        try:
            sock.sendall(request(GET, name))
            code, length = self._reply(sock)
            if code != OK:
                raise TransportError(f"{name}: not on the server", "missing")
            if length < HEADER:
                drain(sock, length)
                raise TransportError(f"a {length}-byte value cannot be a chunk", "corrupt")
            recv_into(sock, header.view)
            region = alloc(length - HEADER)
            if region is None:
                drain(sock, length - HEADER)
                return None
            try:
                recv_into(sock, region.view)
            except BaseException:
                region.view.release()
                raise
            return region
        except OSError as exc:
            raise self._broken(exc) from None

    def put(self, name: str, header: Region, payload: Region, replace: bool) -> None:
        sock = self._conn()
        n = HEADER + payload.view.nbytes
        try:
            sock.sendall(request(PUT, name, n))
            sock.sendall(header.view)
            sock.sendall(payload.view)
            # PUT has no reply: HEALTH is the barrier that says the server read it all
            sock.sendall(request(HEALTH, name))
            code, _ = self._reply(sock)
        except OSError as exc:
            raise self._broken(exc) from None
        if code != OK:
            raise TransportError(f"put {name}: server answered {code}")

    def remove(self, name: str) -> bool:
        return False  # the protocol has no delete: values stay until the server restarts

    def reset(self) -> None:
        """The server went away: drop every connection with a reset, so the server's port is not
        left in FIN_WAIT/TIME_WAIT (lmcache_server binds without SO_REUSEADDR and could not be
        restarted on the same port for a minute)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            abort(s)

    def close(self) -> None:
        self._ok = False
        self.reset()


class LMCacheTier(RemoteTier):
    """``--long-backend lmcache --lmcache-url lm://HOST:PORT`` (see docs/l4.md for its limits)."""

    backend = "lmcache"

    def __init__(self, cfg: DaemonConfig, host: TierHost) -> None:
        assert cfg.lmcache_url is not None  # build_config checked the flags
        super().__init__(cfg, host, LMCacheTransport(cfg.lmcache_url))

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["deletes_supported"] = False
        return out


__all__ = ["LMCacheTier", "LMCacheTransport"]
