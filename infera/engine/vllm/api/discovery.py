"""P/D discovery for ``python -m infera.engine.vllm``: the flags, this worker's record, its registrar.

With ``--etcd-endpoint`` (and ``--discovery-backend etcd``, the only backend) the entry point
registers the worker in etcd once its HTTP server answers ``/health``, keeps the key alive under a
lease, and revokes the lease on a clean shutdown. The record (``infera.discovery.record``) holds
the role from the top-level ``kv_role``, the model, the advertised address, the transports,
whether a kvd connector is among the connectors, and the hash settings, computed with the same
functions the connector uses. etcd being down never stops the engine. ``docs/pd.md`` has the
key layout.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from infera.discovery.record import (
    DEFAULT_PREFIX,
    DEFAULT_TTL_S,
    HashInfo,
    WorkerInfo,
    check_backend,
    ktc_dict,
    worker_key,
)
from infera.discovery.registrar import MIN_TTL_S, Registrar
from infera.errors import UsageError

log = logging.getLogger("infera.engine.vllm")

WILDCARDS = ("", "0.0.0.0", "::", "[::]")
UNUSED_ALONE = ("advertise_host", "request_transport", "kv_event_transport")


def add_arguments(group: Any) -> None:
    """The P/D flags of the product doc, plus the two knobs of the registration."""
    group.add_argument(
        "--advertise-host",
        default=None,
        metavar="HOST",
        help="Address routers and the other leg use to reach this worker (registered in etcd). "
        "Default: $VLLM_HOST_IP, else --host unless it is a wildcard, else this host's name.",
    )
    group.add_argument(
        "--etcd-endpoint",
        default=None,
        metavar="HOST:PORT[,HOST:PORT]",
        help="etcd to register this worker in (prefill/decode discovery).",
    )
    group.add_argument(
        "--discovery-backend",
        default=None,
        metavar="etcd",
        help="Discovery backend: only etcd (implied by --etcd-endpoint).",
    )
    group.add_argument(
        "--request-transport",
        default=None,
        metavar="NAME",
        help="Request transport routers use, recorded in the registration [default: http].",
    )
    group.add_argument(
        "--kv-event-transport",
        default=None,
        metavar="NAME",
        help="KV event transport (e.g. zmq), recorded in the registration.",
    )
    group.add_argument(
        "--discovery-prefix",
        default=DEFAULT_PREFIX,
        metavar="PREFIX",
        help="etcd key prefix of the worker registrations.",
    )
    group.add_argument(
        "--discovery-lease-ttl",
        type=int,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help="Lease of the etcd registration: the key disappears this long after the engine dies.",
    )


@dataclass(frozen=True)
class Plan:
    endpoints: str
    host: str
    port: int
    prefix: str
    ttl: int
    host_source: str

    @property
    def key(self) -> str:
        from infera.discovery.record import worker_id

        return worker_key(self.prefix, worker_id(self.host, self.port))


def plan(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Plan | None:
    """What to register, from the parsed flags; None when discovery is off. Raises UsageError."""
    env = os.environ if environ is None else environ
    backend = check_backend(getattr(args, "discovery_backend", None))
    endpoints = getattr(args, "etcd_endpoint", None)
    if not endpoints:
        if backend:
            raise UsageError(
                f"--discovery-backend {backend} needs --etcd-endpoint HOST:PORT",
                hint="add --etcd-endpoint with the address of your etcd",
            )
        return None
    from infera.discovery.etcd import parse_endpoints

    parse_endpoints(endpoints)  # a bad endpoint is a usage error now, not a retry loop later
    ttl = int(getattr(args, "discovery_lease_ttl", DEFAULT_TTL_S))
    if ttl < MIN_TTL_S:
        raise UsageError(f"--discovery-lease-ttl must be at least {MIN_TTL_S} s (got {ttl})")
    host, source = advertise_host(args, env)
    return Plan(
        endpoints,
        host,
        int(args.port),
        getattr(args, "discovery_prefix", None) or DEFAULT_PREFIX,
        ttl,
        source,
    )


def advertise_host(args: argparse.Namespace, env: Any) -> tuple[str, str]:
    """(address, where it came from): the flag, then VLLM_HOST_IP, then --host, then the host name."""
    if getattr(args, "advertise_host", None):
        return str(args.advertise_host), "--advertise-host"
    if env.get("VLLM_HOST_IP"):
        return str(env["VLLM_HOST_IP"]), "VLLM_HOST_IP"
    if (getattr(args, "host", None) or "") not in WILDCARDS:
        return str(args.host), "--host"
    return socket.gethostname(), "the host name"


def _vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "?"))
    except ImportError:  # pragma: no cover - the entry point always has vLLM
        return "?"


def hash_info(args: argparse.Namespace, vllm_config: Any | None) -> HashInfo:
    """The hash settings, through the connector's own functions when the engine config is known."""
    seed_env = os.environ.get("PYTHONHASHSEED")
    if vllm_config is not None:
        from infera.engine.vllm import compat
        from infera.engine.vllm.keys import hash_settings_of

        facts = compat.engine_facts(vllm_config)
        _settings, fingerprint = hash_settings_of(facts)
        return HashInfo(
            seed_env, _vllm_version(), facts.hash_algo, facts.hash_block_size, facts.hash_seed, fingerprint
        )
    from infera.engine.vllm.keys import hash_seed_mode

    algo = str(getattr(args, "prefix_caching_hash_algo", None) or "sha256")
    try:
        from infera.engine.vllm.compat import fixed_seed_release

        fixed = fixed_seed_release()
    except ImportError:  # pragma: no cover
        fixed = False
    block = getattr(args, "block_size", None)
    return HashInfo(
        seed_env, _vllm_version(), algo, int(block) if block else None, hash_seed_mode(seed_env, algo, fixed)
    )


def _kv_events(vllm_config: Any | None, host: str) -> dict[str, Any] | None:
    cfg = getattr(vllm_config, "kv_events_config", None) if vllm_config is not None else None
    if cfg is None or not getattr(cfg, "enable_kv_cache_events", False):
        return None
    endpoint = str(getattr(cfg, "endpoint", "") or "")
    for wildcard in ("*", "0.0.0.0"):
        endpoint = endpoint.replace(f"://{wildcard}:", f"://{host}:")
    return {
        "publisher": getattr(cfg, "publisher", None),
        "endpoint": endpoint or None,
        "topic": getattr(cfg, "topic", None),
    }


def worker_info(args: argparse.Namespace, p: Plan, vllm_config: Any | None) -> WorkerInfo:
    """This worker as it registers: the engine's own config when known, else the command line."""
    ktc = ktc_dict(getattr(vllm_config, "kv_transfer_config", None)) if vllm_config is not None else None
    if ktc is None:
        ktc = ktc_dict(getattr(args, "kv_transfer_config", None))
    model = str(vllm_config.model_config.model) if vllm_config is not None else str(args.model)
    served = getattr(args, "served_model_name", None) or []
    if isinstance(served, str):
        served = [served]
    from infera.discovery.record import carries_kvd

    kvd_socket = None
    if carries_kvd(ktc):
        kvd_socket = os.environ.get("INFERA_KVD_SOCKET") or getattr(args, "kvd_socket_path", None)
    from infera import __version__

    return WorkerInfo(
        host=p.host,
        port=p.port,
        model=model,
        kv_transfer_config=ktc,
        hash=hash_info(args, vllm_config),
        served_model_names=[str(s) for s in served],
        scheme="https" if getattr(args, "ssl_certfile", None) else "http",
        discovery_backend="etcd",
        request_transport=getattr(args, "request_transport", None) or "http",
        kv_event_transport=getattr(args, "kv_event_transport", None),
        kv_events=_kv_events(vllm_config, p.host),
        kvd_socket=kvd_socket,
        extra={
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "infera_kvd_version": __version__,
            "advertise_host_from": p.host_source,
        },
    )


def health_probe(args: argparse.Namespace) -> Any:
    """A callable that is True once this server answers ``GET /health`` with 200."""
    import httpx

    uds = getattr(args, "uds", None)
    if uds:
        client = httpx.Client(transport=httpx.HTTPTransport(uds=uds), timeout=2.0, trust_env=False)
        url = "http://localhost/health"
    else:
        host = getattr(args, "host", None) or ""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        scheme = "https" if getattr(args, "ssl_certfile", None) else "http"
        client = httpx.Client(timeout=2.0, verify=False, trust_env=False)
        url = f"{scheme}://{host}:{args.port}/health"

    def ready() -> bool:
        try:
            return client.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def _metrics() -> tuple[Any, Any]:
    """(on_failure, on_state) callbacks feeding two Prometheus series on vLLM's /metrics."""
    try:
        from prometheus_client import Counter, Gauge
    except ImportError:  # pragma: no cover - vLLM depends on prometheus_client
        return None, None
    failures = Counter(
        "infera_kvd_discovery_failures",
        "Failed attempts to register or refresh this worker's etcd registration.",
    )
    registered = Gauge("infera_kvd_discovery_registered", "1 while this worker is registered in etcd.")
    return (lambda _exc: failures.inc()), (lambda state: registered.set(1 if state == "registered" else 0))


class AppHolder:
    """The FastAPI app ``build_app`` returned, so the record can use the engine's own config."""

    app: Any = None

    def vllm_config(self) -> Any | None:
        engine = getattr(getattr(self.app, "state", None), "engine_client", None)
        return getattr(engine, "vllm_config", None)


def capture_app(module: Any, holder: AppHolder) -> None:
    original = module.build_app

    def build_app(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)
        holder.app = app
        return app

    module.build_app = build_app


def start(args: argparse.Namespace, app_module: Any | None) -> Registrar | None:
    """Start registering this worker (None when discovery is off); exits 2 on bad flags."""
    try:
        p = plan(args)
    except UsageError as exc:
        print(f"infera-kvd: error: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""), file=sys.stderr)
        raise SystemExit(2) from None
    if p is None:
        given = [f"--{f.replace('_', '-')}" for f in UNUSED_ALONE if getattr(args, f, None)]
        if given:
            print(
                f"infera-kvd: {' '.join(given)} {'is' if len(given) == 1 else 'are'} for the P/D "
                "registration, which needs --etcd-endpoint; not registering this worker",
                file=sys.stderr,
            )
        return None
    from infera.engine.vllm import hookup  # in vLLM's API server: vLLM is imported by now

    hookup.adopt_vllm_logging("infera.engine.vllm", "infera.discovery", level=logging.INFO)
    holder = AppHolder()
    if app_module is not None and int(getattr(args, "api_server_count", 1) or 1) <= 1:
        capture_app(app_module, holder)
    else:
        log.info("infera-kvd: several API servers: the etcd record takes its hash settings from the flags")
    if p.host_source == "the host name":
        log.warning(
            "infera-kvd: no --advertise-host or VLLM_HOST_IP; registering %s (set --advertise-host to "
            "the address the other leg can reach)",
            p.host,
        )
    on_failure, on_state = _metrics()
    registrar = Registrar(
        p.endpoints,
        p.key,
        lambda: _record_base(args, p, holder),
        ttl=p.ttl,
        ready=health_probe(args),
        logger=log,
        on_failure=on_failure,
        on_state=on_state,
    )
    return registrar.start()


def _record_base(args: argparse.Namespace, p: Plan, holder: AppHolder) -> dict[str, Any]:
    from infera.discovery.record import build_record

    return build_record(worker_info(args, p, holder.vllm_config()))
