"""The etcd key layout and the worker record a router reads (``docs/pd.md`` documents both).

One key per worker, ``<prefix><host>:<port>`` (default prefix ``/infera-kvd/v1/workers/``), whose
value is a JSON object (:func:`build_record`) and whose lease expires when the engine dies. A
router lists the prefix once, then watches it. The worker's role comes from the **top-level**
``kv_role`` of its kv-transfer-config, exactly as a router decides it: ``kv_producer`` is a
prefill worker, ``kv_consumer`` a decode worker, ``kv_both`` or no role a mixed worker that is
never paired.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA = 1
DEFAULT_PREFIX = "/infera-kvd/v1/workers/"
DEFAULT_TTL_S = 10
KVD_CONNECTOR = "InferaKvdConnector"
MULTI_CONNECTOR = "MultiConnector"
ROLE_OF_KV_ROLE = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "mixed"}
ROLES = ("prefill", "decode", "mixed")
# the discovery backends a worker registers through (``--discovery-backend``): the engine refuses
# any other at start, and ``kvd launch pd`` refuses it before writing the commands
BACKENDS = ("etcd",)


def check_backend(value: str | None) -> str:
    """``--discovery-backend``'s value, stripped and lower-cased ("" when not given); a name
    outside :data:`BACKENDS` is a UsageError."""
    from infera.errors import UsageError

    backend = (value or "").strip().lower()
    if backend and backend not in BACKENDS:
        raise UsageError(
            f"--discovery-backend {backend!r} is not supported",
            hint="use --discovery-backend " + " or ".join(BACKENDS),
        )
    return backend


def role_of(kv_role: str | None) -> str:
    """``prefill``, ``decode`` or ``mixed`` (``kv_both``, no role, or no kv-transfer-config)."""
    return ROLE_OF_KV_ROLE.get(kv_role or "", "mixed")


def normalize_prefix(prefix: str | None) -> str:
    """The prefix with one leading and one trailing ``/`` (``None`` gives the default)."""
    text = (prefix or DEFAULT_PREFIX).strip().strip("/")
    return f"/{text}/" if text else "/"


def worker_id(host: str, port: int) -> str:
    """``host:port`` (IPv6 addresses in brackets): stable across restarts of one worker."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{shown}:{port}"


def worker_key(prefix: str | None, wid: str) -> str:
    return normalize_prefix(prefix) + wid


def connectors_of(cfg: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The connectors that act, as ``{"name", "kv_role"}``: a MultiConnector's children, else the
    connector itself (an empty list without a kv-transfer-config)."""
    if not isinstance(cfg, dict) or not cfg.get("kv_connector"):
        return []
    if cfg.get("kv_connector") == MULTI_CONNECTOR:
        children = (cfg.get("kv_connector_extra_config") or {}).get("connectors") or []
        out: list[dict[str, Any]] = []
        for child in children:
            out.extend(connectors_of(child) if isinstance(child, dict) else [])
        return out
    return [{"name": str(cfg.get("kv_connector")), "kv_role": cfg.get("kv_role")}]


def carries_kvd(cfg: dict[str, Any] | None) -> bool:
    return any(c["name"] == KVD_CONNECTOR for c in connectors_of(cfg))


def ktc_dict(obj: Any) -> dict[str, Any] | None:
    """A kv-transfer-config as a plain dict, from a dict, a JSON string or vLLM's dataclass."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, str):
        try:
            parsed = json.loads(obj)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    keys = ("kv_connector", "kv_role", "kv_connector_extra_config", "engine_id")
    out = {k: getattr(obj, k, None) for k in keys}
    return out if out.get("kv_connector") else None


@dataclass(frozen=True)
class HashInfo:
    """What decides whether two engines compute the same block hashes (``docs/doctor/hash-settings.md``).

    ``seed`` is the connector's seed mode (``env:<value>``, ``fixed`` or ``random``);
    ``fingerprint`` is the connector's hash fingerprint (``None`` when the block size is unknown).
    """

    python_hash_seed: str | None
    vllm_version: str
    algo: str
    block_size: int | None
    seed: str
    fingerprint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "python_hash_seed": self.python_hash_seed,
            "vllm_version": self.vllm_version,
            "algo": self.algo,
            "block_size": self.block_size,
            "seed": self.seed,
            "fingerprint": self.fingerprint,
        }


@dataclass
class WorkerInfo:
    """Everything a worker announces, before the lease fields are added."""

    host: str
    port: int
    model: str
    kv_transfer_config: dict[str, Any] | None
    hash: HashInfo
    served_model_names: list[str] = field(default_factory=list)
    scheme: str = "http"
    discovery_backend: str = "etcd"
    request_transport: str | None = None
    kv_event_transport: str | None = None
    kv_events: dict[str, Any] | None = None
    kvd_socket: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return worker_id(self.host, self.port)

    @property
    def kv_role(self) -> str | None:
        role = (self.kv_transfer_config or {}).get("kv_role")
        return role if isinstance(role, str) else None

    @property
    def role(self) -> str:
        return role_of(self.kv_role)


def build_record(info: WorkerInfo, **runtime: Any) -> dict[str, Any]:
    """The JSON value stored under the worker's key; ``runtime`` adds fields such as ``lease``."""
    cfg = info.kv_transfer_config or {}
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "id": info.id,
        "role": info.role,
        "kv_role": info.kv_role,
        "kv_connector": cfg.get("kv_connector"),
        "connectors": connectors_of(info.kv_transfer_config),
        "kvd": carries_kvd(info.kv_transfer_config),
        "engine_id": cfg.get("engine_id"),
        "model": info.model,
        "served_model_names": list(info.served_model_names) or [info.model],
        "url": f"{info.scheme}://{info.id}",
        "host": info.host,
        "port": info.port,
        "discovery_backend": info.discovery_backend,
        "request_transport": info.request_transport,
        "kv_event_transport": info.kv_event_transport,
        "kv_events": info.kv_events,
        "kvd_socket": info.kvd_socket,
        "hash": info.hash.to_json(),
    }
    record.update(info.extra)
    record.update(runtime)
    return record


@dataclass(frozen=True)
class Worker:
    """One registration as read back from etcd (for the doctor, and a reference for routers)."""

    key: str
    record: dict[str, Any]
    lease: str

    @property
    def id(self) -> str:
        return str(self.record.get("id") or self.key.rsplit("/", 1)[-1])

    @property
    def role(self) -> str:
        role = self.record.get("role")
        return role if role in ROLES else role_of(self.record.get("kv_role"))

    @property
    def model(self) -> str:
        return str(self.record.get("model") or "?")

    @property
    def connectors(self) -> list[dict[str, Any]]:
        items = self.record.get("connectors") or []
        return [c for c in items if isinstance(c, dict)]

    @property
    def kvd(self) -> bool:
        return bool(self.record.get("kvd")) or any(c.get("name") == KVD_CONNECTOR for c in self.connectors)

    @property
    def hash(self) -> dict[str, Any]:
        h = self.record.get("hash")
        return h if isinstance(h, dict) else {}


def parse_worker(key: str, value: bytes, lease: str = "0") -> Worker:
    """A :class:`Worker` from one etcd key; raises ValueError for a value that is not a record."""
    try:
        record = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(record, dict) or ("role" not in record and "kv_role" not in record):
        raise ValueError("not a worker record (no role)")
    return Worker(key, record, lease)
