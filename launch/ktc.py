"""kv-transfer-configs: the ones ``kvd launch`` writes, and a check of any config users write.

The built-in check mirrors vLLM's ``KVTransferConfig`` (research ``vllm-connector.md`` §2, 0.33 fields)
so it runs without vLLM installed and in milliseconds. :func:`vllm_errors` runs vLLM's own class when
it can be imported: that import takes seconds, so callers do it only on request (``kvd lint --vllm``).
"""

from __future__ import annotations

import copy
from typing import Any

from infera.launch.model import KVD_CONNECTOR, KVD_MODULE, MULTI_CONNECTOR, TRANSPORT_CONNECTOR

ROLE_VALUES = ("kv_producer", "kv_consumer", "kv_both")
FAILURE_POLICIES = ("recompute", "fail")

# field -> expected type name, per vLLM 0.32/0.33
FIELDS: dict[str, str] = {
    "kv_connector": "str|null",
    "engine_id": "str|null",
    "kv_buffer_device": "str",
    "kv_role": "role",
    "kv_port": "int",
    "kv_connector_extra_config": "dict",
    "kv_connector_module_path": "str|null",
    "enable_permute_local_kv": "bool",
    "kv_load_failure_policy": "policy",
}
# Accepted up to vLLM 0.31, rejected from 0.32 on.
REMOVED_FIELDS: dict[str, str] = {
    "kv_buffer_size": "float",
    "kv_rank": "int|null",
    "kv_parallel_size": "int",
    "kv_ip": "str",
}

KVD_CHILD: dict[str, Any] = {
    "kv_connector": KVD_CONNECTOR,
    "kv_role": "kv_both",
    "kv_connector_module_path": KVD_MODULE,
}


def single_config() -> dict[str, Any]:
    """The single-host engine: the kvd connector on its own, as a cache tier (``kv_both``)."""
    return copy.deepcopy(KVD_CHILD)


def _transport(role: str, protocol: str | None) -> dict[str, Any]:
    """The MooncakeConnector of a leg; ``protocol`` (``tcp``, ``rdma``) is vLLM's
    ``kv_connector_extra_config.mooncake_protocol``, left out for vLLM's default (``rdma``)."""
    out: dict[str, Any] = {"kv_connector": TRANSPORT_CONNECTOR, "kv_role": role}
    if protocol:
        out["kv_connector_extra_config"] = {"mooncake_protocol": protocol}
    return out


def prefill_config(protocol: str | None = None) -> dict[str, Any]:
    """P/D prefill: MultiConnector under ``kv_producer`` (what the router pairs on) over kvd + Mooncake."""
    return {
        "kv_connector": MULTI_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {
            "connectors": [copy.deepcopy(KVD_CHILD), _transport("kv_producer", protocol)]
        },
    }


def decode_config(protocol: str | None = None) -> dict[str, Any]:
    """P/D decode: the bare transport as a consumer; no kvd."""
    return _transport("kv_consumer", protocol)


def _type_ok(value: Any, kind: str) -> bool:
    if value is None:
        return kind.endswith("|null")
    base = kind.split("|")[0]
    if base == "str":
        return isinstance(value, str)
    if base == "int":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())
    if base == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base == "bool":
        return isinstance(value, bool) or value in (0, 1, "true", "false", "True", "False", "0", "1")
    if base == "dict":
        return isinstance(value, dict)
    if base == "role":
        return value in ROLE_VALUES
    if base == "policy":
        return value in FAILURE_POLICIES
    return True


def _expect(kind: str) -> str:
    base = kind.split("|")[0]
    names = {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "dict": "a JSON object",
        "role": "one of " + ", ".join(ROLE_VALUES),
        "policy": "one of " + ", ".join(FAILURE_POLICIES),
    }
    text = names[base]
    return text + " or null" if kind.endswith("|null") else text


def builtin_errors(cfg: Any, where: str = "") -> list[str]:
    """What vLLM's KVTransferConfig would reject in ``cfg`` (and in each MultiConnector child).

    Removed fields (``kv_buffer_size`` ...) are not reported here; rule KVD102 owns them because
    whether they are fatal depends on the vLLM version.
    """
    prefix = f"{where}: " if where else ""
    if not isinstance(cfg, dict):
        return [f"{prefix}must be a JSON object, not {type(cfg).__name__}"]
    errors: list[str] = []
    for key, value in cfg.items():
        if key in REMOVED_FIELDS:
            continue
        kind = FIELDS.get(key)
        if kind is None:
            errors.append(f"{prefix}unknown field {key!r}")
        elif not _type_ok(value, kind):
            errors.append(f"{prefix}{key} must be {_expect(kind)}, got {value!r}")
    if cfg.get("kv_connector") and "kv_role" not in cfg:
        errors.append(f"{prefix}kv_role is required when kv_connector is set")
    if cfg.get("kv_connector_module_path") == "":
        errors.append(f"{prefix}kv_connector_module_path must not be empty")
    if cfg.get("kv_connector") == MULTI_CONNECTOR:
        extra = cfg.get("kv_connector_extra_config")
        children = extra.get("connectors") if isinstance(extra, dict) else None
        if not isinstance(children, list) or not children:
            errors.append(
                f"{prefix}MultiConnector needs kv_connector_extra_config.connectors, a list of configs"
            )
        else:
            for i, child in enumerate(children):
                errors.extend(builtin_errors(child, f"connectors[{i}]"))
    return errors


def removed_fields(cfg: Any) -> list[str]:
    """Removed fields used at the top level or in any MultiConnector child."""
    if not isinstance(cfg, dict):
        return []
    found = [k for k in cfg if k in REMOVED_FIELDS]
    extra = cfg.get("kv_connector_extra_config")
    children = extra.get("connectors") if isinstance(extra, dict) else None
    if cfg.get("kv_connector") == MULTI_CONNECTOR and isinstance(children, list):
        for i, child in enumerate(children):
            found.extend(f"connectors[{i}].{k}" for k in removed_fields(child))
    return found


def vllm_available() -> bool:
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None  # a bare directory named vllm is not vLLM


def vllm_errors(cfg: dict[str, Any]) -> list[str]:
    """Build vLLM's own ``KVTransferConfig`` from ``cfg`` and from each MultiConnector child.

    MultiConnector builds ``KVTransferConfig(**child)`` for its children at engine start, so a bad
    child is a startup failure even though the parent config parses. Raises ImportError without vLLM.
    """
    from vllm.config import KVTransferConfig  # slow: seconds

    errors: list[str] = []

    def one(c: dict[str, Any], where: str) -> None:
        try:
            KVTransferConfig(**c)
        except Exception as exc:  # pydantic ValidationError, ValueError, TypeError
            errors.append(f"{where + ': ' if where else ''}vLLM rejects it: {_short(exc)}")

    one(cfg, "")
    extra = cfg.get("kv_connector_extra_config")
    children = extra.get("connectors") if isinstance(extra, dict) else None
    if cfg.get("kv_connector") == MULTI_CONNECTOR and isinstance(children, list):
        for i, child in enumerate(children):
            if isinstance(child, dict):
                one(child, f"connectors[{i}]")
    return errors


def _short(exc: Exception) -> str:
    errs = getattr(exc, "errors", None)
    if callable(errs):
        try:
            items = errs()
            parts = []
            for e in items:
                loc = ".".join(str(x) for x in e.get("loc", ()) if x != "__root__")
                msg = str(e.get("msg", "")).removeprefix("Value error, ")
                parts.append(f"{loc}: {msg}" if loc else msg)
            if parts:
                return "; ".join(parts)
        except Exception:
            pass
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
