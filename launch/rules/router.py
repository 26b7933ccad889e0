"""KVD21x: the vllm-router in front of a prefill/decode deployment, checked against the legs."""

from __future__ import annotations

from collections.abc import Iterator

from infera.launch import router as vr
from infera.launch.model import Deployment, Loc, Router
from infera.launch.rules.registry import Context, Hit, Severity, rule


def _at(r: Router, index: int) -> Loc | None:
    if index < len(r.argv_locs) and r.argv_locs[index] is not None:
        return r.argv_locs[index]
    return r.where()


def _pd_router(r: Router, dep: Deployment) -> bool:
    """A router meant for P/D: it names prefill or decode workers, or the deployment has P/D legs."""
    named = bool(r.uses("--prefill") or r.uses("--decode"))
    return named or any(leg.role in ("prefill", "decode") for leg in dep.legs)


def _shown(addr: tuple[str, int]) -> str:
    return vr.url(addr[0], addr[1])[len("http://") :]


@rule(
    "KVD210",
    "pd-router-mode",
    Severity.ERROR,
    "A router in front of prefill and decode legs runs with --vllm-pd-disaggregation.",
    "Add --vllm-pd-disaggregation to the router's command.",
)
def router_mode(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds a `vllm-router` command that names `--prefill`/`--decode` workers, or sits in a deployment
    with prefill and decode legs, but lacks `--vllm-pd-disaggregation`.

    ## Why it matters
    Without the switch vllm-router is a plain load balancer: each request goes to one worker, start
    to finish. Nothing is handed from prefill to decode, and the `--prefill`/`--decode` lists are
    not used the way they read.

    ## Example
    ```sh
    python -m vllm_router.launch_router --port 8000 --kv-connector mooncake \\
      --prefill http://10.0.0.11:8001 8998 --decode http://10.0.0.12:8002
    ```

    Use instead:
    {{ROUTER_SH}}

    ## Fix
    Add `--vllm-pd-disaggregation`; `kvd launch pd` writes it.
    """
    for r in dep.routers:
        if r.argv is not None and _pd_router(r, dep) and not r.has_flag(vr.PD_SWITCH):
            yield Hit(
                f"router {r.name!r} has no {vr.PD_SWITCH}: it sends each request to one worker and never "
                "pairs prefill with decode",
                r.where(),
            )


@rule(
    "KVD211",
    "pd-router-connector",
    Severity.ERROR,
    "The router's --kv-connector names the transport the legs run (mooncake for MooncakeConnector).",
    "Pass --kv-connector mooncake to a router in front of MooncakeConnector legs.",
)
def router_connector(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Compares the router's `--kv-connector` (vllm-router assumes `nixl` when it is absent) with the
    KV transport of the prefill and decode legs in the same deployment: `MooncakeConnector` is
    `mooncake`, `NixlConnector` is `nixl`, `MoRIIOConnector` is `moriio`.

    ## Why it matters
    The router writes the `kv_transfer_params` that tell decode where to fetch the KV, and their shape
    depends on the connector. In `mooncake` mode it first asks each prefill worker's Mooncake bootstrap
    server for its engine ids; in `nixl` mode it expects NIXL's parameters back from prefill. A router
    speaking another connector than the legs leaves decode without the KV: it recomputes, or fails.

    ## Example
    ```sh
    python -m vllm_router.launch_router --port 8000 --vllm-pd-disaggregation \\
      --prefill http://10.0.0.11:8001 --decode http://10.0.0.12:8002
    ```

    Use instead:
    {{ROUTER_SH}}

    ## Fix
    Give the router the connector the legs' kv-transfer-config names.
    """
    legs = {vr.transport_name(leg) for leg in dep.legs if leg.role in ("prefill", "decode")} - {None}
    for r in dep.routers:
        if r.argv is None or not r.has_flag(vr.PD_SWITCH):
            continue
        given = (
            r.flag_value(vr.CONNECTOR_FLAG) if r.has_flag(vr.CONNECTOR_FLAG) else vr.ROUTER_DEFAULT_CONNECTOR
        )
        if given is None or len(legs) != 1:
            continue
        want = next(iter(legs))
        if given != want:
            how = "" if r.has_flag(vr.CONNECTOR_FLAG) else " (the router's default)"
            yield Hit(
                f"router {r.name!r} uses --kv-connector {given}{how}, but the legs transfer KV with "
                f"{want}: pass --kv-connector {want}",
                r.where_flag(vr.CONNECTOR_FLAG),
            )


@rule(
    "KVD212",
    "pd-router-workers",
    Severity.ERROR,
    "The router's --prefill URLs are the prefill legs (top-level kv_producer), its --decode URLs the decode legs.",
    "Point --prefill at each prefill leg's advertised host:port and --decode at each decode leg's.",
)
def router_workers(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Reads each `--prefill URL [BOOTSTRAP_PORT]` and `--decode URL` of a P/D router and, for the legs in
    the same deployment (one file, or files linted `--together`), checks that:

    * every URL is `http://HOST:PORT` and matches a leg's advertised address (`--advertise-host`, else
      `VLLM_HOST_IP`) and `--port`;
    * a `--prefill` URL points at a prefill leg whose top-level `kv_role` is `kv_producer`, a
      `--decode` URL at a decode leg whose top-level `kv_role` is `kv_consumer`;
    * every prefill and decode leg is among the router's URLs.

    A router with neither workers nor a discovery option (`--service-discovery`,
    `--vllm-discovery-address`) is reported too.

    ## Why it matters
    The router sends the prompt to what `--prefill` names and generation to what `--decode` names. A
    URL with the wrong port reaches no engine (the router waits for it at start, then gives up); the
    legs swapped make decode compute every prompt and prefill wait for KV that never comes. A prefill
    leg with top-level `kv_both` runs as a mixed worker (KVD201): it computes and keeps the KV instead
    of handing it over.

    ## Example
    ```sh
    python -m vllm_router.launch_router --port 8000 --vllm-pd-disaggregation --kv-connector mooncake \\
      --prefill http://10.0.0.12:8002 --decode http://10.0.0.11:8001
    ```

    Use instead:
    {{ROUTER_SH}}

    ## Fix
    Generate the router with the legs (`kvd launch pd`), or copy each leg's advertised host and port.
    """
    known = [leg for leg in dep.legs if vr.leg_address(leg) is not None]
    for r in dep.routers:
        if r.argv is None or not r.has_flag(vr.PD_SWITCH):
            continue
        prefill, decode = vr.workers(r, "--prefill"), vr.workers(r, "--decode")
        discovery = r.has_flag("--service-discovery") or r.has_flag("--vllm-discovery-address")
        if not discovery and not (prefill and decode):
            missing = " and ".join(f for f, ws in (("--prefill", prefill), ("--decode", decode)) if not ws)
            yield Hit(f"router {r.name!r} has no {missing} worker: nothing to pair", r.where())
        for w, role, top in [
            *((w, "prefill", "kv_producer") for w in prefill),
            *((w, "decode", "kv_consumer") for w in decode),
        ]:
            if w.url is None:
                continue
            if w.address is None:
                yield Hit(
                    f"router {r.name!r}: {w.flag} {w.url!r} is not an http://HOST:PORT URL", _at(r, w.index)
                )
                continue
            leg = vr.leg_at(dep, w.address)
            if leg is None:
                if known:
                    legs = ", ".join(f"{lg.role} {_shown(vr.leg_address(lg))}" for lg in known)  # type: ignore[arg-type]
                    yield Hit(
                        f"router {r.name!r}: {w.flag} {w.url} is no leg of this deployment ({legs})",
                        _at(r, w.index),
                    )
                continue
            if leg.role != role:
                yield Hit(
                    f"router {r.name!r}: {w.flag} {w.url} is the {leg.role} leg {leg.name!r}, not a {role} leg",
                    _at(r, w.index),
                )
            elif leg.ktc() is not None and leg.top_role() != top:
                shown = repr(leg.top_role()) if leg.top_role() else "absent"
                yield Hit(
                    f"router {r.name!r}: {w.flag} {w.url} is leg {leg.name!r}, whose top-level kv_role is "
                    f"{shown}, not {top!r}: vLLM runs it as a mixed worker",
                    _at(r, w.index),
                )
        listed = {w.address for w in [*prefill, *decode] if w.address is not None}
        if discovery:
            continue
        for leg in known:
            addr = vr.leg_address(leg)
            if leg.role in ("prefill", "decode") and addr not in listed:
                yield Hit(
                    f"{leg.role} leg {leg.name!r} at {_shown(addr)} is not among router {r.name!r}'s "  # type: ignore[arg-type]
                    f"--{leg.role} URLs: it gets no requests",
                    r.where(),
                )


@rule(
    "KVD213",
    "pd-router-bootstrap",
    Severity.ERROR,
    "With --kv-connector mooncake, each --prefill names its leg's Mooncake bootstrap port.",
    "Write the prefill leg's VLLM_MOONCAKE_BOOTSTRAP_PORT (default 8998) after its --prefill URL.",
)
def router_bootstrap(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    For a router with `--kv-connector mooncake`, compares the bootstrap port after each `--prefill URL`
    (the router uses 8998 when there is none) with the port the matching prefill leg's Mooncake
    bootstrap server listens on: its `VLLM_MOONCAKE_BOOTSTRAP_PORT`, else vLLM's default 8998.

    ## Why it matters
    Before vllm-router opens its own port it asks `GET http://HOST:BOOTSTRAP/query` of every prefill
    worker for the engine ids it puts into decode's `kv_transfer_params`, retrying 30 times over about
    five minutes. A wrong port means a router that does not serve at all while it retries.

    ## Example
    ```sh
    VLLM_MOONCAKE_BOOTSTRAP_PORT=9100 python -m infera.engine.vllm --port 8001 ...   # prefill
    python -m vllm_router.launch_router ... --kv-connector mooncake --prefill http://10.0.0.11:8001 8998
    ```

    Use instead:
    ```sh
    VLLM_MOONCAKE_BOOTSTRAP_PORT=9100 python -m infera.engine.vllm --port 8001 ...   # prefill
    python -m vllm_router.launch_router ... --kv-connector mooncake --prefill http://10.0.0.11:8001 9100
    ```

    ## Fix
    Keep the two equal; `kvd launch pd` writes vLLM's default on the router and leaves the leg at it.
    """
    for r in dep.routers:
        if r.argv is None or r.flag_value(vr.CONNECTOR_FLAG) != "mooncake":
            continue
        for w in vr.workers(r, "--prefill"):
            leg = vr.leg_at(dep, w.address) if w.address else None
            if leg is None or leg.role != "prefill":
                continue
            listens = vr.bootstrap_port(leg)
            if w.bootstrap_unknown:
                continue
            asks = vr.DEFAULT_BOOTSTRAP if w.bootstrap in (None, "none") else w.bootstrap
            if listens is not None and str(asks) != str(listens):
                yield Hit(
                    f"router {r.name!r}: --prefill {w.url} asks for the Mooncake bootstrap on port {asks}, "
                    f"but leg {leg.name!r} serves it on {listens}: the router waits for it instead of serving",
                    _at(r, w.index),
                )
