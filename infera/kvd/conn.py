"""One client connection as the daemon sees it, and the typed request error."""

from __future__ import annotations

import socket
import time
from typing import Any

from infera.kvd import protocol as P
from infera.kvd.store import Chunk

Reply = dict[str, Any] | None


class BadRequest(Exception):
    """A request that is well-framed but wrong; answered with a typed error, connection kept."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


class Client:
    """State of one connection. Leases and reservations die with it."""

    def __init__(self, sock: socket.socket, cid: int, pid: int, uid: int, gid: int) -> None:
        self.sock = sock
        self.id = cid
        self.peer_pid = pid
        self.uid = uid
        self.gid = gid
        self.reader: P.FrameReader | None = None
        self.out = bytearray()
        self.want_write = False
        self.hello = False
        self.info: dict[str, Any] = {}
        self.ns_id = 0
        self.namespace = ""
        self.leases: dict[int, Chunk] = {}
        self.reservations: dict[int, Chunk] = {}
        self.next_token = 1
        self.connected_at = time.time()
        self.requests = 0
        self.report: dict[str, Any] = {}
        self.closed = False
        self.arena_mapped = False

    def public(self) -> dict[str, Any]:
        info = self.info
        return {
            "id": self.id,
            "pid": info.get("pid", self.peer_pid),
            "peer_pid": self.peer_pid,
            "uid": self.uid,
            "name": info.get("name", ""),
            "role": info.get("role", ""),
            "model": info.get("model", ""),
            "namespace": self.namespace,
            "hash_settings": info.get("hash_settings", {}),
            "hash_fingerprint": info.get("hash_fingerprint", ""),
            "chunk_tokens": info.get("chunk_tokens"),
            "kv_layout": info.get("kv_layout"),
            "data_path": self.report.get(
                "data_path", info.get("data_path", "arena" if self.arena_mapped else "none")
            ),
            "fallback": self.report.get("fallback"),
            "fallback_reason": self.report.get("fallback_reason"),
            "requested_path": self.report.get("requested_path"),
            "counters": self.report.get("counters", {}),
            "leases": len(self.leases),
            "reservations": len(self.reservations),
            "requests": self.requests,
            "connected_s": round(time.time() - self.connected_at, 1),
        }
