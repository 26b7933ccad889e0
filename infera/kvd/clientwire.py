"""The client's wire: one socket to a kvd daemon, frames out, replies matched to requests.

:class:`infera.kvd.client.KvdClient` builds on it, through :class:`~infera.kvd.clientarena.ArenaIO`;
this part knows nothing of chunks or arenas. Replies are read whole (a frame may arrive in pieces,
several may arrive in one read); with a spin window set, a reader polls the socket briefly before
it blocks.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from infera.display import printable
from infera.kvd import protocol as P
from infera.kvd.clientnet import KvdClientError, KvdProtocolError, KvdUnavailable, error_of

NOT_KVD_HINT = "give the socket a kvd daemon listens on (`kvd serve --socket PATH`, or INFERA_KVD_SOCKET)"


class Wire:
    """Requests and replies over one connection; thread-safe (one lock around each request)."""

    def __init__(self, socket_path: str, spin_s: float) -> None:
        self.socket_path = socket_path
        self._lock = threading.Lock()
        self._next_id = 1
        self._reader = P.FrameReader()
        self._pending: list[bytes] = []
        self._sock: socket.socket | None = None
        self._spin = spin_s
        # True once a reply made sense as kvd's: until then a peer that answers something else
        # (an HTTP server, another program's socket) is said to be no kvd daemon
        self.greeted = False

    def _take_replies(self, data: bytes) -> None:
        """Add the whole frames in ``data``, just read from kvd, to the pending replies; no data
        means kvd closed the connection."""
        if not data:
            raise KvdUnavailable(f"kvd at {self.socket_path} closed the connection")
        try:
            self._pending.extend(self._reader.feed(data))
        except P.FrameTooLarge as exc:
            if not self.greeted:  # "HTTP/1.1 ..." reads as a frame of 1213486160 bytes
                raise self._not_kvd(f"its reply begins {printable(repr(bytes(data[:16])))}") from None
            raise KvdProtocolError(str(exc)) from None

    def _not_kvd(self, why: str) -> KvdProtocolError:
        return KvdProtocolError(f"{self.socket_path} is not a kvd daemon: {why}", hint=NOT_KVD_HINT)

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
                self._take_replies(data)
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
            self._take_replies(data)
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
            raise (
                self._not_kvd(problem.replace("daemon ", "it ", 1))
                if not self.greeted
                else KvdProtocolError(problem)
            )
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
            raise error_of(reply, op)
        return reply

    def notify(self, op: str, **fields: Any) -> None:
        """Send a request that gets no reply (RELEASE, REPORT)."""
        with self._lock:
            self._send({"op": op, "noreply": True, **fields})


__all__ = ["Wire"]
