"""vllm-router, the P/D router ``kvd launch pd`` puts in front of the legs: its command, in one place.

`vllm-router` (PyPI ``vllm-router``, a Rust router with a Python launcher) pairs a prefill and a
decode worker per request. With ``--vllm-pd-disaggregation --kv-connector mooncake`` it asks each
prefill worker's Mooncake bootstrap server (``GET http://HOST:BOOTSTRAP/query``) for its engine ids
before it opens its own port, sends the prompt to prefill with ``max_tokens`` 1, and hands decode
the ``kv_transfer_params`` that tell it where to pull the KV from. ``kvd launch`` writes the command
and ``kvd lint`` (KVD21x) reads it back; both use the names below.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from infera.launch.model import TRANSPORT_CONNECTOR, Deployment, Leg, Router

ROUTER_MODULE = ["-m", "vllm_router.launch_router"]
DEFAULT_PORT = 8000  # the client-facing port; the legs default to 8001 and 8002
# vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default; the router also falls back to it
BOOTSTRAP_ENV = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
DEFAULT_BOOTSTRAP = 8998
PD_SWITCH = "--vllm-pd-disaggregation"
CONNECTOR_FLAG = "--kv-connector"
ROUTER_DEFAULT_CONNECTOR = "nixl"  # what the router assumes without --kv-connector
# vLLM connector of the legs -> the router's --kv-connector value
CONNECTOR_NAMES = {TRANSPORT_CONNECTOR: "mooncake", "NixlConnector": "nixl", "MoRIIOConnector": "moriio"}


def url(host: str, port: int | str) -> str:
    """``http://host:port``, IPv6 hosts in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def argv(
    python: str, host: str, port: int, prefill: list[tuple[str, int | None]], decode: list[str]
) -> list[str]:
    """The router's command: ``prefill`` is (URL, bootstrap port or None) per prefill worker."""
    out = [python, *ROUTER_MODULE, "--host", host, "--port", str(port), PD_SWITCH]
    out += [CONNECTOR_FLAG, "mooncake"]
    for u, boot in prefill:
        out += ["--prefill", u] + ([str(boot)] if boot is not None else [])
    for u in decode:
        out += ["--decode", u]
    return out


def build(python: str, host: str, port: int, prefill_url: str, decode_url: str) -> Router:
    """The router of a ``kvd launch pd`` deployment: one prefill worker (with vLLM's default
    bootstrap port spelled out, so the router and the leg visibly agree) and one decode worker."""
    return Router(
        name="router",
        argv=argv(python, host, port, [(prefill_url, DEFAULT_BOOTSTRAP)], [decode_url]),
        args_start=3,
    )


@dataclass
class Worker:
    """One ``--prefill URL [BOOTSTRAP]`` or ``--decode URL`` of a router command."""

    flag: str
    url: str | None  # None when not statically known
    address: tuple[str, int] | None  # (host, port) parsed from url
    bootstrap: str | None  # as written: a port, "none", or None when absent or unknown
    index: int  # argv index of the flag, for locations
    bootstrap_unknown: bool = False  # given, but not statically known


def workers(r: Router, flag: str) -> list[Worker]:
    out = []
    for use in r.uses(flag):
        text = r.word(use.value_index) if use.value_index is not None else None
        boot = r.word(use.more[0]) if use.more else None
        unknown = bool(use.more) and boot is None
        out.append(Worker(flag, text, address(text) if text else None, boot, use.index, unknown))
    return out


def address(text: str) -> tuple[str, int] | None:
    """(host, port) of ``http://host:port[/...]``; None when it is not such a URL."""
    try:
        parts = urlsplit(text if "://" in text else "http://" + text)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


def leg_address(leg: Leg) -> tuple[str, int] | None:
    """Where a router reaches ``leg``: its advertised address (``--advertise-host``, else
    ``VLLM_HOST_IP``, else a non-wildcard ``--host``) and its ``--port`` (vLLM's 8000 when absent)."""
    host = leg.flag_value("--advertise-host") or leg.env_value("VLLM_HOST_IP")
    if host is None:
        listen = leg.flag_value("--host")
        host = listen if listen is not None and listen not in _WILDCARDS else None
    port_text = leg.flag_value("--port") if leg.has_flag("--port") else "8000"
    if host is None or port_text is None or not port_text.isdigit():
        return None
    return host.strip("[]").lower(), int(port_text)


def leg_at(dep: Deployment, addr: tuple[str, int]) -> Leg | None:
    for leg in dep.legs:
        if leg_address(leg) == addr:
            return leg
    return None


def transport_name(leg: Leg) -> str | None:
    """The router's name for the KV transport ``leg`` runs (``mooncake`` for MooncakeConnector)."""
    for c in leg.connectors():
        if c.name in CONNECTOR_NAMES:
            return CONNECTOR_NAMES[c.name]
    return None


def bootstrap_port(leg: Leg) -> int | None:
    """The Mooncake bootstrap port of a prefill leg (its env, else vLLM's default); None if unknown."""
    if BOOTSTRAP_ENV in leg.env:
        value = leg.env[BOOTSTRAP_ENV]
        return int(value) if value is not None and value.isdigit() else None
    return DEFAULT_BOOTSTRAP if leg.env_complete else None
