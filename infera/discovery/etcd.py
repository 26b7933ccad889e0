"""A small client for etcd's v3 HTTP JSON gateway (etcd 3.4 and later), over httpx.

The gateway needs no gRPC or protobuf: every call is a POST of a JSON body to ``/v3/...``. Keys
and values travel base64-encoded, and int64 fields (lease IDs, TTLs, revisions) come back as JSON
strings: lease IDs are kept as those strings and passed back unchanged, so no precision is lost.

Only what discovery needs is here: put/get/delete, prefix ranges, and leases (grant, keepalive,
revoke, time-to-live). Every failure is an :class:`EtcdError`; :class:`EtcdUnavailable` means no
endpoint answered at all.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from infera.errors import KvdError, UsageError

DEFAULT_PORT = 2379
_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+")


class EtcdError(KvdError):
    """etcd answered with an error, or an answer we could not read."""


class EtcdUnavailable(EtcdError):
    """No endpoint could be reached (refused, timed out, name not resolved)."""


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def prefix_end(prefix: str | bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # every key


def parse_endpoints(text: str | Sequence[str]) -> list[str]:
    """``host:port``, ``http(s)://host:port`` or a comma-separated list of them, as base URLs.

    A bare host gets etcd's client port 2379; IPv6 addresses go in brackets (``[::1]:2379``).
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        url = item if "://" in item else f"http://{item}"
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise UsageError(f"etcd endpoint {item!r} is not HOST:PORT ({exc})") from None
        if parsed.scheme not in ("http", "https") or not _HOST.fullmatch(parsed.host):
            raise UsageError(f"etcd endpoint {item!r} is not HOST:PORT", hint="e.g. 10.0.0.5:2379")
        host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
        out.append(f"{parsed.scheme}://{host}:{parsed.port or DEFAULT_PORT}")
    if not out:
        raise UsageError("no etcd endpoint given", hint="e.g. --etcd-endpoint 10.0.0.5:2379")
    return out


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    lease: str
    create_revision: int
    mod_revision: int

    def json(self) -> Any:
        return json.loads(self.value)


class EtcdClient:
    """One etcd cluster, reached through the first of its endpoints that answers."""

    def __init__(self, endpoints: str | Sequence[str], timeout: float = 2.0) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self._http = httpx.Client(timeout=timeout, trust_env=False)
        self._good = 0

    @property
    def endpoint(self) -> str:
        """The endpoint that answered last (the first one before any call)."""
        return self.endpoints[self._good]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        order = [self._good, *(i for i in range(len(self.endpoints)) if i != self._good)]
        errors: list[str] = []
        for i in order:
            url = self.endpoints[i] + path
            try:
                resp = self._http.post(url, json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{self.endpoints[i]}: {type(exc).__name__}: {exc}".rstrip(": "))
                continue
            self._good = i
            return self._answer(resp, path)
        raise EtcdUnavailable(
            f"cannot reach etcd ({'; '.join(errors)})",
            hint="check the endpoint (HOST:PORT of etcd's client URL) and that etcd is running",
        )

    @staticmethod
    def _answer(resp: httpx.Response, path: str) -> dict[str, Any]:
        try:
            data = resp.json()
        except ValueError:
            raise EtcdError(
                f"etcd {path} answered HTTP {resp.status_code} with no JSON: {resp.text[:200]!r}",
                hint="is this etcd 3.4 or later (the v3 HTTP gateway)?",
            ) from None
        if not isinstance(data, dict):
            raise EtcdError(f"etcd {path} answered {type(data).__name__}, not an object")
        if resp.status_code >= 400 or "error" in data:
            message = data.get("message") or data.get("error") or resp.reason_phrase
            raise EtcdError(f"etcd {path}: {message}")
        return data

    # -- keys -------------------------------------------------------------------------------------

    def put(self, key: str, value: str | bytes, lease: str | None = None) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        return int(self._post("/v3/kv/put", body).get("header", {}).get("revision", 0))

    def get(self, key: str) -> KeyValue | None:
        kvs = self._range({"key": _b64(key)})
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self._range({"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})

    def _range(self, body: dict[str, Any]) -> list[KeyValue]:
        out = []
        for kv in self._post("/v3/kv/range", body).get("kvs", []) or []:
            out.append(
                KeyValue(
                    key=_unb64(kv.get("key")).decode(errors="replace"),
                    value=_unb64(kv.get("value")),
                    lease=str(kv.get("lease", "0")),
                    create_revision=int(kv.get("create_revision", 0)),
                    mod_revision=int(kv.get("mod_revision", 0)),
                )
            )
        return out

    def delete(self, key: str, prefix: bool = False) -> int:
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        return int(self._post("/v3/kv/deleterange", body).get("deleted", 0))

    # -- leases -----------------------------------------------------------------------------------

    def grant(self, ttl: int) -> tuple[str, int]:
        """A new lease: (its ID as etcd's decimal string, the TTL etcd granted)."""
        data = self._post("/v3/lease/grant", {"TTL": int(ttl)})
        lease = str(data.get("ID", ""))
        if not lease or lease == "0":
            raise EtcdError(f"etcd granted no lease: {data}")
        return lease, int(data.get("TTL", ttl))

    def keepalive(self, lease: str) -> int:
        """Refresh ``lease``; returns its TTL again, or 0 when etcd no longer has it."""
        data = self._post("/v3/lease/keepalive", {"ID": lease})
        return int((data.get("result") or {}).get("TTL", 0) or 0)

    def revoke(self, lease: str) -> bool:
        """Revoke ``lease`` and delete its keys; False when it had already expired."""
        try:
            self._post("/v3/lease/revoke", {"ID": lease})
        except EtcdUnavailable:
            raise
        except EtcdError as exc:
            if "not found" in exc.message:
                return False
            raise
        return True

    def time_to_live(self, lease: str) -> int:
        """Seconds left on ``lease``; -1 when etcd does not have it."""
        return int(self._post("/v3/lease/timetolive", {"ID": lease}).get("TTL", -1))

    def health(self) -> bool:
        try:
            resp = self._http.get(self.endpoint + "/health")
            return bool(resp.status_code == 200 and resp.json().get("health") == "true")
        except (httpx.HTTPError, ValueError):
            return False
