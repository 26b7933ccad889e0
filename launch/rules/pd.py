"""KVD2xx: prefill/decode disaggregation."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from infera.launch.model import (
    KTC_FLAG,
    KVD_CONNECTOR,
    MULTI_CONNECTOR,
    PD_FLAGS,
    TRANSPORT_CONNECTOR,
    Deployment,
    Leg,
)
from infera.launch.rules.registry import Context, Hit, Severity, rule

PRODUCT_PREFILL = (
    "MultiConnector with kv_role kv_producer over [InferaKvdConnector kv_both, MooncakeConnector kv_producer]"
)


def _pd_legs(dep: Deployment, role: str) -> list[Leg]:
    return [leg for leg in dep.legs if leg.role == role]


@rule(
    "KVD201",
    "pd-prefill-role",
    Severity.ERROR,
    "A prefill leg's top-level kv_role is kv_producer.",
    'Set "kv_role":"kv_producer" on the top level of the prefill leg\'s kv-transfer-config.',
)
def prefill_role(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds a prefill leg (one whose transport child is `MooncakeConnector` `kv_producer`, or that a spec
    file declares `role: prefill`) whose top-level `kv_role` is not `kv_producer`.

    ## Why it matters
    The router reads the top-level role to decide what a worker is. `kv_producer` makes it a prefill
    worker that gets a Mooncake bootstrap and a decode partner. `kv_both`, or no role, registers the
    worker as mixed: prefill and decode never pair, and every request is served start to finish by
    whichever worker gets it. Nothing fails; the deployment just is not disaggregated.

    ## Example
    ```json
    {"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[
      {"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},
      {"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}
    ```

    Use instead:
    {{PREFILL_KTC_JSON}}

    ## Fix
    Put `kv_producer` on the top level. The kvd child stays `kv_both` (rule KVD104).
    """
    for leg in _pd_legs(dep, "prefill"):
        cfg = leg.ktc()
        if cfg is None:
            continue
        top = leg.top_role()
        if top != "kv_producer":
            shown = repr(top) if top else "absent"
            yield Hit(
                f"prefill leg {leg.name!r} has top-level kv_role {shown}: the router registers it as "
                "mixed and never pairs it with a decode leg",
                leg.where_flag(KTC_FLAG),
            )


@rule(
    "KVD202",
    "pd-prefill-connectors",
    Severity.ERROR,
    "A prefill leg with kvd runs a MultiConnector over InferaKvdConnector and MooncakeConnector.",
    f"Use {PRODUCT_PREFILL} (see `kvd launch pd --format json`).",
)
def prefill_connectors(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    On a prefill leg that uses kvd (it sets `INFERA_KVD_*` variables or has an `InferaKvdConnector`),
    checks that the kv-transfer-config is a `MultiConnector` whose children include both
    `InferaKvdConnector` (the cache tier) and `MooncakeConnector` (the transport to decode). A spec leg
    declared `role: prefill` must have a kv-transfer-config at all.

    ## Why it matters
    vLLM runs one connector per engine unless it is wrapped in `MultiConnector`. A prefill leg that
    keeps its bare `MooncakeConnector` and only gains the kvd environment variables never talks to the
    daemon: no L3 hits, no error. A leg with only `InferaKvdConnector` has the cache but sends nothing
    to decode, so decode recomputes every prompt.

    ## Example
    ```sh
    PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\
    python -m infera.engine.vllm --model m --port 8001 --etcd-endpoint etcd:2379 \\
      --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}'
    ```

    Use instead:
    ```sh
    PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\
    python -m infera.engine.vllm --model m --port 8001 --etcd-endpoint etcd:2379 \\
      --kv-transfer-config '{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}'
    ```

    ## Fix
    Wrap both connectors in a `MultiConnector`, kvd first: `MultiConnector` asks its children in
    order and takes the first hit, so a local kvd hit wins over a transfer.
    """
    for leg in _pd_legs(dep, "prefill"):
        if leg.argv is None:
            continue
        cfg = leg.ktc()
        loc = leg.where_flag(KTC_FLAG)
        if cfg is None:
            if leg.declared_role == "prefill" and not leg.has_flag(KTC_FLAG):
                yield Hit(f"prefill leg {leg.name!r} has no {KTC_FLAG}", leg.where())
            continue
        conns = leg.connectors()
        names = [c.name for c in conns]
        wants_kvd = bool(leg.kvd_env()) or KVD_CONNECTOR in names
        top = conns[0].name
        if top == TRANSPORT_CONNECTOR and wants_kvd:
            yield Hit(
                f"prefill leg {leg.name!r} sets the kvd environment but runs a bare MooncakeConnector: "
                "the kvd tier is never used",
                loc,
            )
        elif top == KVD_CONNECTOR:
            yield Hit(
                f"prefill leg {leg.name!r} runs only InferaKvdConnector: nothing sends KV to the decode leg",
                loc,
            )
        elif top == MULTI_CONNECTOR:
            children = names[1:]
            if TRANSPORT_CONNECTOR not in children:
                yield Hit(
                    f"prefill leg {leg.name!r}: the MultiConnector has no MooncakeConnector child, so "
                    "nothing sends KV to the decode leg",
                    loc,
                )
            if wants_kvd and KVD_CONNECTOR not in children:
                yield Hit(
                    f"prefill leg {leg.name!r} sets the kvd environment but its MultiConnector has no "
                    "InferaKvdConnector child",
                    loc,
                )


@rule(
    "KVD203",
    "pd-transport-role",
    Severity.ERROR,
    "On a prefill leg the MooncakeConnector is kv_producer.",
    'Set "kv_role":"kv_producer" on the MooncakeConnector child of the prefill leg.',
)
def transport_role(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks that the `MooncakeConnector` of a prefill leg (a `MultiConnector` child, or the top level)
    has `kv_role` `kv_producer`.

    ## Why it matters
    Each `MultiConnector` child acts on its own role. A transport child with `kv_both` or `kv_consumer`
    on the prefill side waits for KV it will never receive, or offers KV it is not set up to send.

    ## Example
    ```json
    {"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[
      {"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},
      {"kv_connector":"MooncakeConnector","kv_role":"kv_both"}]}}
    ```

    Use instead:
    {{PREFILL_KTC_JSON}}

    ## Fix
    Make the transport child `kv_producer` on prefill; decode's bare `MooncakeConnector` is `kv_consumer`.
    """
    for leg in _pd_legs(dep, "prefill"):
        for c in leg.connectors():
            if c.name == TRANSPORT_CONNECTOR and c.role is not None and c.role != "kv_producer":
                where = f" ({c.where})" if c.where else ""
                yield Hit(
                    f"prefill leg {leg.name!r}: MooncakeConnector{where} has kv_role {c.role!r}, not 'kv_producer'",
                    leg.where_flag(KTC_FLAG),
                )


@rule(
    "KVD204",
    "pd-decode-leg",
    Severity.ERROR,
    "The decode leg is a bare MooncakeConnector kv_consumer with no kvd.",
    'Give decode exactly \'{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}\' and drop its INFERA_KVD_* '
    "variables and --kvd-socket-path.",
)
def decode_leg(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks the decode leg (top-level `kv_role` `kv_consumer`, or declared `role: decode`): its
    kv-transfer-config is the bare `MooncakeConnector` with `kv_role` `kv_consumer`, and it carries no
    kvd: no `InferaKvdConnector`, no `INFERA_KVD_*` variables, no `--kvd-socket-path`.

    ## Why it matters
    In this design kvd is an L3 tier of the prefill side. Decode only receives KV over the transport.
    A kvd connector on decode makes it look up and store blocks on a host that usually has no daemon
    (each lookup fails and is retried), or fills the decode host's cache with blocks no prefill will
    read. A `MultiConnector` on decode also changes how the router sees the worker.

    ## Example
    ```sh
    PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\
    python -m infera.engine.vllm --model m --port 8002 --etcd-endpoint etcd:2379 \\
      --kv-transfer-config '{"kv_connector":"MultiConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}]}}'
    ```

    Use instead:
    ```sh
    PYTHONHASHSEED=0 \\
    python -m infera.engine.vllm --model m --port 8002 --etcd-endpoint etcd:2379 \\
      --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'
    ```

    ## Fix
    Keep the decode command exactly as your P/D setup had it before kvd.
    """
    for leg in _pd_legs(dep, "decode"):
        conns = leg.connectors()
        loc = leg.where_flag(KTC_FLAG)
        if any(c.name == KVD_CONNECTOR for c in conns):
            yield Hit(
                f"decode leg {leg.name!r} has an InferaKvdConnector: decode only consumes over the transport",
                loc,
            )
        elif conns and conns[0].name != TRANSPORT_CONNECTOR:
            yield Hit(f"decode leg {leg.name!r} runs {conns[0].name}, not a bare MooncakeConnector", loc)
        elif conns and conns[0].role != "kv_consumer":
            yield Hit(
                f"decode leg {leg.name!r}: MooncakeConnector has kv_role {conns[0].role!r}, not 'kv_consumer'",
                loc,
            )
        env = leg.kvd_env()
        if env:
            yield Hit(
                f"decode leg {leg.name!r} sets {', '.join(env)}: decode has no kvd", leg.where_env(env[0])
            )
        if leg.has_flag("--kvd-socket-path"):
            yield Hit(
                f"decode leg {leg.name!r} has --kvd-socket-path: decode has no kvd",
                leg.where_flag("--kvd-socket-path"),
            )


@rule(
    "KVD205",
    "pd-discovery-mismatch",
    Severity.ERROR,
    "Prefill and decode agree on the etcd endpoint, discovery backend and transports.",
    "Pass the same --etcd-endpoint, --discovery-backend, --request-transport and --kv-event-transport to every leg.",
)
def discovery_mismatch(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Compares `--etcd-endpoint`, `--discovery-backend`, `--request-transport` and `--kv-event-transport`
    across the prefill and decode legs of one deployment. Each flag must be present on all legs or on
    none, with the same value.

    ## Why it matters
    Workers find each other through the discovery backend. A decode leg registered in another etcd, or
    speaking another request or event transport, is invisible to the prefill side: both legs start and
    serve, and no request is ever disaggregated.

    ## Example
    ```sh
    python -m infera.engine.vllm ... --etcd-endpoint etcd-a:2379 --discovery-backend etcd ...   # prefill
    python -m infera.engine.vllm ... --etcd-endpoint etcd-b:2379 --discovery-backend etcd ...   # decode
    ```

    Use instead:
    ```sh
    python -m infera.engine.vllm ... --etcd-endpoint etcd-a:2379 --discovery-backend etcd ...   # prefill
    python -m infera.engine.vllm ... --etcd-endpoint etcd-a:2379 --discovery-backend etcd ...   # decode
    ```

    ## Fix
    Generate both legs from one command (`kvd launch pd --etcd HOST:PORT ...`) so the values cannot drift.
    """
    legs = [leg for leg in dep.legs if leg.role in ("prefill", "decode") and leg.argv is not None]
    if not any(leg.role == "prefill" for leg in legs) or not any(leg.role == "decode" for leg in legs):
        return
    for flag in PD_FLAGS:
        present = [leg for leg in legs if leg.has_flag(flag)]
        if not present:
            continue
        first = present[0]
        ref = first.flag_value(flag)
        for leg in legs:
            if leg is first:
                continue
            if not leg.has_flag(flag):
                yield Hit(
                    f"{leg.role} leg {leg.name!r} has no {flag}, but {first.role} leg {first.name!r} has {ref}",
                    leg.where(),
                )
                continue
            val = leg.flag_value(flag)
            if ref is not None and val is not None and val != ref:
                yield Hit(
                    f"{leg.role} leg {leg.name!r} has {flag} {val}, but {first.role} leg {first.name!r} has {ref}",
                    leg.where_flag(flag),
                )


def _unroutable(host: str) -> bool:
    if host.lower() in ("localhost", "0.0.0.0", "::", "[::]"):
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return addr.is_loopback or addr.is_unspecified


@rule(
    "KVD206",
    "pd-advertise-host",
    Severity.WARNING,
    "A P/D leg advertises a routable address, the same one as its VLLM_HOST_IP.",
    "Set --advertise-host and VLLM_HOST_IP to the address the other leg reaches this host on.",
)
def advertise_host(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    On legs that register in etcd (`--etcd-endpoint`), checks that `--advertise-host` is present, is
    not a loopback or wildcard address (`127.0.0.1`, `localhost`, `0.0.0.0`, `::`), and equals
    `VLLM_HOST_IP` when both are set.

    ## Why it matters
    The advertised address is what the router and the other leg connect to. A loopback address works
    only when both legs share a host; a wildcard is not an address at all. When the KV transport binds
    to `VLLM_HOST_IP` and the worker advertises another address, requests arrive but KV transfers fail.

    ## Example
    ```sh
    VLLM_HOST_IP=10.0.0.5 python -m infera.engine.vllm ... --advertise-host 0.0.0.0 --etcd-endpoint etcd:2379
    ```

    Use instead:
    ```sh
    VLLM_HOST_IP=10.0.0.5 python -m infera.engine.vllm ... --advertise-host 10.0.0.5 --etcd-endpoint etcd:2379
    ```

    ## Fix
    Use the host's routable address for both. `--host 0.0.0.0` is still right for the listening socket.
    """
    for leg in dep.legs:
        if leg.argv is None or not leg.has_flag("--etcd-endpoint"):
            continue
        use = leg.flag("--advertise-host")
        if use is None:
            yield Hit(f"leg {leg.name!r} registers in etcd but has no --advertise-host", leg.where())
            continue
        host = leg.flag_value("--advertise-host")
        if host is None:
            continue
        if _unroutable(host):
            yield Hit(
                f"leg {leg.name!r} advertises {host}, which other hosts cannot reach",
                leg.where_flag("--advertise-host"),
            )
        ip = leg.env_value("VLLM_HOST_IP")
        if ip is not None and ip != host:
            yield Hit(
                f"leg {leg.name!r} advertises {host} but VLLM_HOST_IP is {ip}",
                leg.where_env("VLLM_HOST_IP"),
            )
