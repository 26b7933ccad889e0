"""One client connection as the daemon sees it, the typed request error, and the checks of what a
request holds: its id, its batch fields, and the bounds on what a client may declare about itself
(HELLO, REPORT)."""

from __future__ import annotations

import functools
import itertools
import math
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from infera import kvlayout
from infera.kvd import protocol as P
from infera.kvd.budget import PinBudget
from infera.kvd.outqueue import OutQueue
from infera.kvd.store import Chunk

Reply = dict[str, Any] | None


class BadRequest(Exception):
    """A request that is well-framed but wrong; answered with a typed error, connection kept."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


class Client:
    """State of one connection. Leases and reservations die with it."""

    def __init__(
        self, sock: socket.socket, cid: int, pid: int, uid: int, gid: int, quota: int | None = None
    ) -> None:
        self.sock = sock
        self.id = cid
        self.peer_pid = pid
        self.uid = uid
        self.gid = gid
        self.reader: P.FrameReader | None = None
        self.out = OutQueue()  # replies the kernel has not taken yet (see infera.kvd.outqueue)
        self.events = 0  # what the loop's selector watches this socket for
        # frames received, waiting for this client's turn; a big request being handled in slices
        # (infera.kvd.slices.Sliced) sits in front of the frames that came after it
        self.inbox: deque[Any] = deque()
        self.out_paused = False  # too many replies queued: its requests are not read meanwhile
        self.out_logged = False
        self.inbuf = 0  # bytes of a partial frame counted against the daemon's input budget
        self.partial_since = 0.0  # when its incomplete frame began (input budget victims)
        self.hello = False
        self.info: dict[str, Any] = {}
        self.ns_id = 0
        self.namespace = ""
        self.ns_seen: set[str] = set()  # namespaces this connection said HELLO with
        self.ns_used = False  # a request of this connection may have left state under ns_id
        self.leases: dict[int, Chunk] = {}
        self.reservations: dict[int, Chunk] = {}
        self.budget = PinBudget(quota)  # what its reservations, leases and holds may pin (--client-quota)
        self.next_token = 1
        self.connected_at = time.time()
        self.requests = 0
        self.report: dict[str, Any] = {}
        self.closed = False
        self.arena_mapped = False

    @property
    def label(self) -> str:
        """How the log names it: ``client 3 (vllm-worker, pid 4242)``."""
        return f"client {self.id} ({self.info.get('name', '?')}, pid {self.info.get('pid', self.peer_pid)})"

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
            "counters_omitted": self.report.get("counters_omitted", 0),
            "leases": len(self.leases),
            "reservations": len(self.reservations),
            "pinned_bytes": self.budget.used,
            "quota_bytes": self.budget.limit,
            "quota_refused": self.budget.refused,
            "requests": self.requests,
            "connected_s": round(time.time() - self.connected_at, 1),
        }


# -- the request id --------------------------------------------------------------------------------
def check_id(msg: dict[str, Any]) -> None:
    """A request's ``id`` is an integer, echoed in its reply (docs/protocol.md). Only a ``noreply``
    request may leave it out (it gets no reply to carry it), and the slices of a big request carry
    none (the request itself was checked). Anything else is a BadRequest, answered with ``id: 0``."""
    rid = msg.get("id")
    if type(rid) is int:
        return
    if "id" not in msg and (msg.get("noreply") or "_sliced" in msg):
        return
    if "id" not in msg:
        raise BadRequest("a request needs an integer 'id' (only a noreply request may leave it out)")
    raise BadRequest(f"'id' must be an integer, not {_type_name(rid)}")


def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


Handler = Callable[[Any, Client, dict[str, Any]], Reply]


def id_checked(handler: Handler) -> Handler:
    """``handler`` (an op method) preceded by :func:`check_id`."""

    @functools.wraps(handler)
    def run(self: Any, client: Client, msg: dict[str, Any]) -> Reply:
        check_id(msg)
        return handler(self, client, msg)

    return run


# -- the batch fields of a request ------------------------------------------------------------------
def request_keys(msg: dict[str, Any], field: str = "keys") -> list[bytes]:
    """``msg[field]``: a list of at most MAX_BATCH valid keys; raises BadRequest."""
    keys = msg.get(field)
    if not isinstance(keys, list):
        raise BadRequest(f"{field!r} must be a list of byte strings")
    if len(keys) > P.MAX_BATCH:
        raise BadRequest(f"at most {P.MAX_BATCH} keys per request")
    maxlen = P.MAX_KEY_LEN
    for k in keys:
        if type(k) is not bytes or not 0 < len(k) <= maxlen:
            try:
                P.check_key(k)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
    return keys


def request_ints(msg: dict[str, Any], field: str) -> list[int]:
    """``msg[field]``: a list of at most MAX_BATCH integers; raises BadRequest."""
    vals = msg.get(field)
    if not isinstance(vals, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        raise BadRequest(f"{field!r} must be a list of integers")
    if len(vals) > P.MAX_BATCH:
        raise BadRequest(f"at most {P.MAX_BATCH} items per request")
    return vals


# -- bounded client metadata (HELLO, REPORT) ---------------------------------------------------
# Everything a client declares ends up in every STATS reply, so each field has a bound (the
# numbers are in infera.kvd.protocol): identities are refused over it, display-only text is cut,
# and whole numbers must be in the range of what they count.
_HELLO_FIELDS: tuple[tuple[str, type, int], ...] = (
    # field, type, longest kept: display-only text is cut there (0: not cut; checked below);
    # for an int, the largest value allowed (at least 1)
    ("name", str, P.MAX_TEXT_LEN),
    ("pid", int, P.MAX_PID),
    ("role", str, P.MAX_TEXT_LEN),
    ("model", str, P.MAX_TEXT_LEN),
    ("hash_fingerprint", str, 0),
    ("chunk_tokens", int, P.MAX_CHUNK_TOKENS),
    ("data_path", str, P.MAX_TEXT_LEN),
)


def hello_info(msg: dict[str, Any]) -> dict[str, Any]:
    """The client description of a HELLO, checked and bounded; raises BadRequest."""
    info: dict[str, Any] = {}
    for field, typ, bound in _HELLO_FIELDS:
        value = msg.get(field)
        if value is None:
            continue
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise BadRequest(f"{field!r} must be a {typ.__name__}")
        if isinstance(value, int) and not 1 <= value <= bound:
            raise BadRequest(f"{field!r} must be a whole number from 1 to {bound}")
        info[field] = value[:bound] if bound and isinstance(value, str) else value
    fp = info.get("hash_fingerprint")
    if fp is not None and len(fp) > P.MAX_FINGERPRINT_LEN:
        raise BadRequest(f"'hash_fingerprint' must be at most {P.MAX_FINGERPRINT_LEN} characters")
    settings = msg.get("hash_settings")
    if settings is not None:
        info["hash_settings"] = _hash_settings(settings)
    if msg.get(kvlayout.FIELD) is not None:
        try:
            info[kvlayout.FIELD] = kvlayout.check(msg[kvlayout.FIELD])
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    return info


def _hash_settings(settings: Any) -> dict[str, Any]:
    if not isinstance(settings, dict):
        raise BadRequest("'hash_settings' must be a map")
    if len(settings) > P.MAX_HASH_SETTINGS:
        raise BadRequest(f"'hash_settings' may hold at most {P.MAX_HASH_SETTINGS} settings")
    for key, value in settings.items():
        if not isinstance(key, str) or len(key) > P.MAX_SETTING_NAME_LEN:
            raise BadRequest(
                f"'hash_settings' names must be strings of at most {P.MAX_SETTING_NAME_LEN} characters"
            )
        if not (
            value is None
            or isinstance(value, bool | int)
            or (isinstance(value, float) and math.isfinite(value))
            or (isinstance(value, str) and len(value) <= P.MAX_TEXT_LEN)
        ):
            raise BadRequest(
                f"'hash_settings' values must be numbers (finite), booleans, null or strings of at most "
                f"{P.MAX_TEXT_LEN} characters"
            )
    return settings


def _finite(value: Any) -> bool:
    """A number a client may declare: an int, a bool, or a float that is not NaN or infinite
    (those have no JSON, and what clients declare is printed by ``kvd stat --json``)."""
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def report_fields(report: Any) -> dict[str, Any]:
    """A REPORT's data path, fallback and counters, checked and bounded; raises BadRequest."""
    if not isinstance(report, dict):
        raise BadRequest("'report' must be a map")
    counters = report.get("counters", {})
    if not isinstance(counters, dict) or not all(
        isinstance(k, str) and _finite(v) for k, v in counters.items()
    ):
        raise BadRequest("'report.counters' must map names to finite numbers")
    clean: dict[str, Any] = {"counters": counters}
    if len(counters) > P.MAX_REPORT_COUNTERS or any(len(k) > P.MAX_COUNTER_NAME_LEN for k in counters):
        kept = dict(
            itertools.islice(
                ((k, v) for k, v in counters.items() if len(k) <= P.MAX_COUNTER_NAME_LEN),
                P.MAX_REPORT_COUNTERS,
            )
        )
        clean = {"counters": kept, "counters_omitted": len(counters) - len(kept)}
    for field in ("data_path", "fallback_reason", "requested_path"):
        value = report.get(field)
        if value is not None:
            if not isinstance(value, str):
                raise BadRequest(f"'report.{field}' must be a string")
            clean[field] = value[: P.MAX_REPORT_TEXT]
    clean["fallback"] = bool(report.get("fallback", False))
    return clean
