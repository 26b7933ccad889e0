"""``kvd launch single|pd`` options -> the deployment model, with one-line errors naming the flag.

The commands are the product doc's, built from typed options rather than pasted, so the roles,
the socket, the hash seed and the GPU-direct roots agree by construction; the rules then check the
result once more before anything is printed.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from dataclasses import dataclass, field

from infera.errors import UsageError
from infera.kvd import flags
from infera.kvd.flags import FlagValues
from infera.launch import ktc
from infera.launch import router as vrouter
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
    router_port: int = vrouter.DEFAULT_PORT
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
    """Every missing required option in one error (not one per run)."""
    missing = [
        (flag, what)
        for flag, attr, what in REQUIRED.get(o.kind, [])
        if getattr(o, attr) is None or not str(getattr(o, attr)).strip()
    ]
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


def _port(value: int, flag: str) -> str:
    if not 0 < int(value) < 65536:
        raise UsageError(f"{flag}: {value} is not a TCP port")
    return str(int(value))


def _routable(host: str, flag: str) -> str:
    bad = host.lower() in ("localhost", "0.0.0.0", "::")
    try:
        addr = ipaddress.ip_address(host)
        bad = bad or addr.is_loopback or addr.is_unspecified
    except ValueError:
        pass
    if bad:
        raise UsageError(
            f"{flag}: {host} is not routable from another host",
            hint="use the address the other leg reaches this host on",
        )
    return host


def _daemon(o: LaunchOptions) -> Daemon:
    """The daemon's command: its flags checked by the daemon's own table, plus launch's absolute paths."""
    if not o.socket.startswith("/"):
        raise UsageError(f"--socket: {o.socket!r} is not an absolute path")
    flags.check(o.daemon).raise_first()
    if o.long_path is not None and not o.long_path.startswith("/"):
        raise UsageError(f"--long-path: {o.long_path!r} is not an absolute path")
    argv = [_python(o), *DAEMON_MODULE]
    for f in flags.FLAGS:
        if f.name in ALWAYS or f.name in o.daemon.given:
            argv += f.argv(o.daemon.get(f.dest))
    argv += o.daemon_args
    return Daemon(name="kvd", argv=argv, args_start=3)


def _python(o: LaunchOptions) -> str:
    return o.python if o.python and o.python.strip() else default_python(o.image)


def _seed_env(o: LaunchOptions) -> dict[str, str | None]:
    seed = o.hash_seed.strip().lower()
    if seed == "none":
        return {}
    if not (seed.isdigit() and int(seed) <= 4294967295):
        raise UsageError(f"--hash-seed: {o.hash_seed!r} is not an integer in [0, 4294967295] or 'none'")
    return {"PYTHONHASHSEED": seed}


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
    daemon = _daemon(o)
    seed = _seed_env(o)
    extra = _engine_args(o)
    prewarm = ["--kvd-socket-path", o.socket] if o.prewarm else []
    dep = Deployment(
        kind=o.kind, python=_python(o), image=o.image, vllm_version=o.vllm_version, daemons=[daemon]
    )
    if o.kind == "single":
        flags = ["--model", model, "--port", _port(o.port, "--port"), "--host", o.host, *prewarm, *extra]
        flags.append("--enable-prefix-caching")
        dep.legs.append(_leg(o, "engine", "single", {**seed, **_kvd_env(o)}, flags, ktc.single_config()))
        return dep
    if o.kind != "pd":
        raise UsageError(f"unknown deployment kind {o.kind!r}")
    etcd = _need(o.etcd, "--etcd", "the etcd endpoint both legs register in, as HOST:PORT")
    if not re.fullmatch(r"[^\s:/]+:\d{1,5}", etcd) and not re.fullmatch(r"\[[0-9a-fA-F:]+\]:\d{1,5}", etcd):
        raise UsageError(f"--etcd: {etcd!r} is not HOST:PORT")
    p_host = _routable(
        _need(o.advertise_host, "--advertise-host", "the prefill host's routable address"), "--advertise-host"
    )
    d_host = _routable(o.decode_advertise_host or p_host, "--decode-advertise-host")
    for flag, val in (
        ("--discovery-backend", o.discovery_backend),
        ("--request-transport", o.request_transport),
        ("--kv-event-transport", o.kv_event_transport),
    ):
        _need(val, flag, "a transport name")
    pd_flags = [
        "--etcd-endpoint",
        etcd,
        "--discovery-backend",
        o.discovery_backend,
        "--request-transport",
        o.request_transport,
        "--kv-event-transport",
        o.kv_event_transport,
    ]
    p_flags = ["--model", model, "--port", _port(o.prefill_port, "--prefill-port"), "--host", o.host]
    p_flags += ["--advertise-host", p_host, *pd_flags, *prewarm, *extra, "--enable-prefix-caching"]
    p_env = {**seed, **_kvd_env(o), "VLLM_HOST_IP": p_host}
    proto = _protocol(o.transfer_protocol)
    dep.legs.append(_leg(o, "prefill", "prefill", p_env, p_flags, ktc.prefill_config(proto)))
    d_flags = ["--model", model, "--port", _port(o.decode_port, "--decode-port"), "--host", o.host]
    d_flags += ["--advertise-host", d_host, *pd_flags, *extra]
    dep.legs.append(
        _leg(o, "decode", "decode", {**seed, "VLLM_HOST_IP": d_host}, d_flags, ktc.decode_config(proto))
    )
    if o.router:
        port = int(_port(o.router_port, "--router-port"))
        if port in (o.prefill_port, o.decode_port) and p_host == d_host:
            raise UsageError(f"--router-port: {port} is taken by a leg on the same host")
        prefill_url = vrouter.url(p_host, o.prefill_port)
        decode_url = vrouter.url(d_host, o.decode_port)
        dep.routers.append(vrouter.build(_python(o), o.host, port, prefill_url, decode_url))
    return dep


def _protocol(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    if value.strip() not in ("tcp", "rdma"):
        raise UsageError(f"--transfer-protocol: {value!r} is not tcp or rdma")
    return value.strip()
