"""``kvd launch single|pd`` options -> the deployment model, with one-line errors naming the flag.

The commands are the product doc's, built from typed options rather than pasted, so the roles,
the socket, the hash seed and the GPU-direct roots agree by construction; the rules then check the
result once more before anything is printed.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

from infera.errors import UsageError
from infera.kvd import flags
from infera.kvd.flags import FlagValues
from infera.launch import ktc, values
from infera.launch import router as vrouter
from infera.launch.argv import parse_flags
from infera.launch.model import KTC_FLAG, Daemon, Deployment, Leg, ktc_json
from infera.launch.spec import DAEMON_MODULE, ENGINE_MODULE

# daemon flags every emitted command spells out (the socket ties the engines to it; the size is the
# first thing to edit); the others appear when given
ALWAYS = ("--socket", "--max-bytes")
# flags kvd launch sets itself: passing them through --engine-arg would fight the generated ones
OWNED_ENGINE_FLAGS = {
    "--model",
    "--port",
    "--host",
    "--kv-transfer-config",
    "--advertise-host",
    "--etcd-endpoint",
    "--discovery-backend",
    "--request-transport",
    "--kv-event-transport",
    "--kvd-socket-path",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
}


@dataclass
class LaunchOptions:
    kind: str = "single"
    model: str | None = None
    daemon: FlagValues = field(default_factory=FlagValues)  # the daemon's flags, as kvd serve takes them
    ais: bool = False
    hipfile_roots: list[str] = field(default_factory=list)
    host: str = "0.0.0.0"
    port: int = 8000
    etcd: str | None = None
    advertise_host: str | None = None
    decode_advertise_host: str | None = None
    prefill_port: int = 8001
    decode_port: int = 8002
    discovery_backend: str = "etcd"
    request_transport: str = "http"
    kv_event_transport: str = "zmq"
    router: bool = True  # pd: also write vllm-router's command (--no-router: bring your own)
    router_port: int | None = None  # None: vrouter.DEFAULT_PORT (given with --no-router: refused)
    transfer_protocol: str | None = None  # pd: kv_connector_extra_config.mooncake_protocol (tcp, rdma)
    hash_seed: str = "0"
    prewarm: bool = False
    engine_args: list[str] = field(default_factory=list)
    daemon_args: list[str] = field(default_factory=list)
    python: str | None = None  # None: :func:`default_python`
    image: str | None = None
    vllm_version: str | None = None

    @property
    def socket(self) -> str:
        return str(self.daemon.get("socket") or "")

    @property
    def long_path(self) -> str | None:
        path = self.daemon.get("long_path")
        return None if path is None else str(path)


def default_python(image: str | None) -> str:
    """The interpreter of the commands when ``--python`` is not given.

    Without ``--image`` the commands run on a host: the absolute path of the Python running
    ``kvd launch`` (the environment that has infera-kvd; systemd looks nothing up in a venv, and
    Debian and Ubuntu ship no bare ``python``). With ``--image`` they run in a container:
    ``python3`` from the image's PATH.
    """
    if image:
        return "python3"
    return sys.executable or "python3"


# required options of each kind: (flag, LaunchOptions field, what it is)
REQUIRED = {
    "single": [("--model", "model", "the model the engines serve (a Hugging Face id or a local path)")],
    "pd": [
        ("--model", "model", "the model the engines serve (a Hugging Face id or a local path)"),
        ("--etcd", "etcd", "the etcd endpoint both legs register in, as HOST:PORT"),
        ("--advertise-host", "advertise_host", "the prefill host's routable address"),
    ],
}


def _check_required(o: LaunchOptions) -> None:
    """Every missing required option in one error (not one per run); one given empty is named as such."""
    for flag, attr, what in REQUIRED.get(o.kind, []):
        values.not_empty(getattr(o, attr), flag, what)
    missing = [(flag, what) for flag, attr, what in REQUIRED.get(o.kind, []) if getattr(o, attr) is None]
    if len(missing) == 1:
        raise UsageError(f"{missing[0][0]} is required: {missing[0][1]}")
    if missing:
        raise UsageError(
            f"{len(missing)} required options are missing: "
            + "; ".join(f"{flag} ({what})" for flag, what in missing),
            hint="kvd launch " + o.kind + " " + " ".join(f"{flag} ..." for flag, _ in missing),
        )


def _need(value: str | None, flag: str, what: str) -> str:
    if value is None or not str(value).strip():
        raise UsageError(f"{flag} is required: {what}")
    return str(value).strip()


def daemon_flags_written(given: FlagValues) -> frozenset[str]:
    """The daemon flags ``kvd launch`` writes into the daemon's command itself: the ones it always
    spells out and every one given as an option. ``--daemon-arg`` may not give these again."""
    return frozenset(f.name for f in flags.FLAGS if f.name in ALWAYS or f.name in given.given)


def _daemon(o: LaunchOptions) -> tuple[Daemon, FlagValues]:
    """The daemon's command and its values: its flags checked by the daemon's own table, plus
    launch's absolute paths. ``--daemon-arg`` flags are written as given, after the table has
    checked the whole set."""
    values.absolute_path(o.socket, "--socket")
    written = daemon_flags_written(o.daemon)
    merged = _with_daemon_args(o.daemon, o.daemon_args, written)
    flags.check(merged).raise_first()
    if o.long_path is not None:
        values.absolute_path(o.long_path, "--long-path")
    argv = [_python(o), *DAEMON_MODULE]
    for f in flags.FLAGS:
        if f.name in written:
            argv += f.argv(o.daemon.get(f.dest))
    argv += o.daemon_args
    return Daemon(name="kvd", argv=argv, args_start=3), merged


def _with_daemon_args(given: FlagValues, args: list[str], written: frozenset[str]) -> FlagValues:
    """The daemon's values with the ``--daemon-arg`` flags added, for the table's checks. A flag that
    kvd launch writes itself (``written``), one the daemon does not have, or a stray word is refused."""
    merged: dict[str, Any] = dict(given.values)
    names = set(given.given)
    uses = parse_flags(args, 0, flags.SWITCHES)
    taken = {u.index for u in uses} | {u.value_index for u in uses}
    stray = next((a for i, a in enumerate(args) if i not in taken), None)
    if stray is not None:
        raise UsageError(f"--daemon-arg {stray!r}: not a daemon flag (write --daemon-arg=--name=value)")
    for use in uses:
        f = flags.BY_NAME.get(use.name)
        if f is None:
            raise UsageError(
                f"--daemon-arg {use.name}: the daemon has no such flag",
                hint="`kvd launch single --help` lists the daemon's flags under Daemon",
            )
        if f.name in written:
            raise UsageError(
                f"--daemon-arg {f.name}: kvd launch sets this flag itself; use its own option {f.name}"
            )
        if f.kind == "switch":
            if use.value is not None:
                raise UsageError(f"--daemon-arg {f.name}: this switch takes no value")
            merged[f.dest] = True
        elif use.value is None:
            raise UsageError(f"--daemon-arg {f.name}: needs a value ({f.name}=VALUE)")
        elif f.kind == "list":
            merged[f.dest] = [*(merged.get(f.dest) or []), use.value]
        else:
            merged[f.dest] = use.value
        names.add(f.name)
    return FlagValues(merged, frozenset(names))


def _python(o: LaunchOptions) -> str:
    return o.python if o.python and o.python.strip() else default_python(o.image)


def _seed_env(o: LaunchOptions) -> dict[str, str | None]:
    seed = o.hash_seed.strip().lower()
    if seed == "none":
        _check_unset_seed(o)
        return {}
    if not (seed.isdigit() and int(seed) <= 4294967295):
        raise UsageError(f"--hash-seed: {o.hash_seed!r} is not an integer in [0, 4294967295] or 'none'")
    return {"PYTHONHASHSEED": seed}


def _check_unset_seed(o: LaunchOptions) -> None:
    """``--hash-seed none`` where vLLM seeds every process randomly, which KVD301 reports as an error
    (its reasoning, from :mod:`infera.keyrules`): ``--vllm-version`` 0.28 or older, or a hash
    algorithm that is not seeded with a constant (``--engine-arg=--prefix-caching-hash-algo=xxhash``)."""
    from infera.keyrules import (
        DEFAULT_HASH_ALGO,
        HASH_ALGO_FLAG,
        fixed_seed_release,
        hash_seed_mode,
        random_seed_reason,
    )

    version = values.vllm_version(o.vllm_version)
    uses = [u for u in parse_flags(o.engine_args, 0) if u.name == HASH_ALGO_FLAG]
    algo = (uses[-1].value if uses else None) or DEFAULT_HASH_ALGO
    if hash_seed_mode(None, algo, fixed_seed_release(version)) == "random":
        raise UsageError(
            f"--hash-seed none: {random_seed_reason(algo, version)}, so keys change on every restart "
            "and no two engines share them",
            hint="use --hash-seed 0 (right on every vLLM version)",
        )


def _kvd_env(o: LaunchOptions) -> dict[str, str | None]:
    env: dict[str, str | None] = {"INFERA_KVD_SOCKET": o.socket}
    roots: list[str] = []
    for item in o.hipfile_roots:
        name, sep, path = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path.startswith("/"):
            raise UsageError(f"--hipfile-root: {item!r} is not NAME=/absolute/path")
        if name == "long":
            raise UsageError("--hipfile-root long=... is set from --long-path; name other roots differently")
        roots.append(f"{name}={path}")
    if o.ais:
        if not o.long_path:
            raise UsageError("--ais needs --long-path: GPU-direct reads the disk tier's chunk files")
        env["INFERA_KVD_AIS"] = "1"
        env["INFERA_KVD_HIPFILE_ROOTS"] = ",".join([f"long={o.long_path}", *roots])
    elif roots:
        raise UsageError("--hipfile-root needs --ais (the roots are read only by GPU-direct)")
    return env


def _engine_args(o: LaunchOptions) -> list[str]:
    for arg in o.engine_args:
        name = arg.split("=", 1)[0]
        if name in OWNED_ENGINE_FLAGS or name.startswith(KTC_FLAG):
            raise UsageError(f"--engine-arg {name}: kvd launch sets this flag itself; use its own option")
    return list(o.engine_args)


def _leg(
    o: LaunchOptions, name: str, role: str, env: dict[str, str | None], flags: list[str], cfg: dict
) -> Leg:  # type: ignore[type-arg]
    argv = [_python(o), *ENGINE_MODULE, *flags, KTC_FLAG, ktc_json(cfg)]
    return Leg(name=name, argv=argv, env=env, args_start=3, declared_role=role, entry="infera")


def build(o: LaunchOptions) -> Deployment:
    """The deployment for ``o``; raises UsageError naming every missing flag, or the first bad one."""
    _check_required(o)
    model = _need(o.model, "--model", "the model the engines serve (a Hugging Face id or a local path)")
    values.vllm_version(o.vllm_version)
    host = values.host(o.host, "--host")
    daemon, daemon_values = _daemon(o)
    seed = _seed_env(o)
    extra = _engine_args(o)
    prewarm = ["--kvd-socket-path", o.socket] if o.prewarm else []
    dep = Deployment(
        kind=o.kind, python=_python(o), image=o.image, vllm_version=o.vllm_version, daemons=[daemon]
    )
    if o.kind == "single":
        port = str(values.tcp_port(o.port, "--port"))
        _port_clash(daemon_values, host, [(host, port, "--port", "the engine")])
        flags = ["--model", model, "--port", port, "--host", host, *prewarm, *extra]
        flags.append("--enable-prefix-caching")
        dep.legs.append(_leg(o, "engine", "single", {**seed, **_kvd_env(o)}, flags, ktc.single_config()))
        return dep
    if o.kind != "pd":
        raise UsageError(f"unknown deployment kind {o.kind!r}")
    return _build_pd(o, dep, daemon_values, model, host, seed, prewarm, extra)


def _build_pd(
    o: LaunchOptions,
    dep: Deployment,
    daemon_values: FlagValues,
    model: str,
    host: str,
    seed: dict[str, str | None],
    prewarm: list[str],
    extra: list[str],
) -> Deployment:
    """The prefill and decode legs (and the router) of ``kvd launch pd``."""
    from infera.discovery.record import check_backend

    etcd = values.endpoint(_need(o.etcd, "--etcd", "the etcd endpoint"), "--etcd")
    p_host = values.routable(
        _need(o.advertise_host, "--advertise-host", "the prefill host's routable address"), "--advertise-host"
    )
    d_host = values.routable(o.decode_advertise_host or p_host, "--decode-advertise-host")
    check_backend(values.name(o.discovery_backend, "--discovery-backend"))
    pd_flags = ["--etcd-endpoint", etcd, "--discovery-backend", o.discovery_backend.strip()]
    pd_flags += ["--request-transport", values.name(o.request_transport, "--request-transport")]
    pd_flags += ["--kv-event-transport", values.name(o.kv_event_transport, "--kv-event-transport")]
    p_port = str(values.tcp_port(o.prefill_port, "--prefill-port"))
    d_port = str(values.tcp_port(o.decode_port, "--decode-port"))
    if not o.router and o.router_port is not None:
        raise UsageError(
            "--router-port is the router's port, but --no-router leaves the router out; keep one"
        )
    router_port = values.tcp_port(o.router_port or vrouter.DEFAULT_PORT, "--router-port")
    listening: list[tuple[str, Any, str, str]] = [
        (p_host, p_port, "--prefill-port", "the prefill leg"),
        (d_host, d_port, "--decode-port", "the decode leg"),
    ]
    if o.router and p_host == d_host:  # where the router runs is yours to pick; on the legs' host it must fit
        listening.append((p_host, router_port, "--router-port", "the router"))
    _port_clash(daemon_values, p_host, listening)
    p_flags = ["--model", model, "--port", p_port, "--host", host]
    p_flags += ["--advertise-host", p_host, *pd_flags, *prewarm, *extra, "--enable-prefix-caching"]
    p_env = {**seed, **_kvd_env(o), "VLLM_HOST_IP": p_host}
    proto = _protocol(o.transfer_protocol)
    dep.legs.append(_leg(o, "prefill", "prefill", p_env, p_flags, ktc.prefill_config(proto)))
    d_flags = ["--model", model, "--port", d_port, "--host", host]
    d_flags += ["--advertise-host", d_host, *pd_flags, *extra]
    dep.legs.append(
        _leg(o, "decode", "decode", {**seed, "VLLM_HOST_IP": d_host}, d_flags, ktc.decode_config(proto))
    )
    if o.router:
        prefill_url = vrouter.url(p_host, p_port)
        decode_url = vrouter.url(d_host, d_port)
        dep.routers.append(vrouter.build(_python(o), host, router_port, prefill_url, decode_url))
    return dep


def _port_clash(daemon: FlagValues, host: str, ports: list[tuple[str, Any, str, str]]) -> None:
    """Refuse two listeners on one port of one host. ``host`` runs the daemon (its ``--metrics-port``)
    and the first engine, and for ``pd`` the prefill leg's Mooncake bootstrap server (vLLM's port,
    which the router's ``--prefill URL 8998`` names)."""
    fixed: list[tuple[str, Any, str, str]] = []
    if any(flag == "--prefill-port" for _, _, flag, _ in ports):
        owner = "the prefill leg's Mooncake bootstrap server (vLLM's default port)"
        fixed.append((host, vrouter.DEFAULT_BOOTSTRAP, "", owner))
    metrics = daemon.get("metrics_port")
    if metrics:
        fixed.append((host, metrics, "--metrics-port", "the daemon's --metrics-port"))
    values.port_clash([*fixed, *ports])


def _protocol(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    if value.strip() not in ("tcp", "rdma"):
        raise UsageError(f"--transfer-protocol: {value!r} is not tcp or rdma")
    return value.strip()
