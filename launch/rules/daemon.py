"""KVD5xx: the daemon's own flags, checked with the daemon's own validation code."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

from infera.errors import UsageError
from infera.launch.model import Daemon, Deployment, Loc
from infera.launch.rules.registry import Context, Hit, Severity, rule

DISTRIBUTED = ("mooncake", "lmcache")
# Flags of the distributed tier (issue: `--long-backend mooncake`), accepted ahead of the daemon.
MOONCAKE_FLAGS = ("--mooncake-master", "--mooncake-metadata", "--mooncake-protocol", "--mooncake-device")
MOONCAKE_PROTOCOLS = ("tcp", "rdma")


def daemon_options() -> dict[str, tuple[str, Any, str | None]]:
    """``--flag`` -> (parameter name, default, env var) for every option of `infera.kvd.cli.serve`."""
    from infera.kvd.cli import serve

    out: dict[str, tuple[str, Any, str | None]] = {}
    for name, param in inspect.signature(serve).parameters.items():
        info = param.default
        decls = getattr(info, "param_decls", None) or ()
        envvar = getattr(info, "envvar", None)
        for decl in decls:
            for flag in str(decl).split("/"):
                if flag.startswith("--"):
                    out[flag] = (
                        name,
                        getattr(info, "default", None),
                        envvar if isinstance(envvar, str) else None,
                    )
    for flag in MOONCAKE_FLAGS:
        out.setdefault(flag, (flag[2:].replace("-", "_"), None, None))
    return out


@rule(
    "KVD501",
    "long-tier-disk-and-distributed",
    Severity.ERROR,
    "The daemon's long tier is disk or distributed, never both.",
    "Drop --long-path/--long-bytes to use the distributed store, or drop --long-backend to use local disk.",
)
def long_tier_both(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds a daemon started with both a disk tier (`--long-path`) and a distributed long tier
    (`--long-backend mooncake` or `lmcache`).

    ## Why it matters
    The daemon has one long tier below the RAM arena. It refuses this combination at start, so the
    daemon never comes up and every engine on the host serves without kvd.

    ## Example
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G \\
      --long-path /nvme/kvd-long --long-bytes 256G --long-backend mooncake --mooncake-master m:50051
    ```

    Use instead:
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G \\
      --long-backend mooncake --mooncake-master m:50051
    ```

    ## Fix
    Pick one: local disk (L3) to survive restarts on one host, or a distributed store (L4) to share
    KV across hosts.
    """
    for d in dep.daemons:
        backend = (d.long_backend or "").lower()
        if d.has_flag("--long-path") and backend in DISTRIBUTED:
            yield Hit(
                f"daemon has --long-path and --long-backend {backend}: the long tier is disk or distributed, never both",
                d.where_flag("--long-backend"),
            )


def _config_error(d: Daemon, opts: dict[str, tuple[str, Any, str | None]]) -> str | None:
    """Run the daemon's own flag validation (`infera.kvd.config.build_config`) over ``d``'s flags."""
    from infera.kvd.config import LONG_BACKENDS, build_config

    values: dict[str, Any] = {}
    for name, default, envvar in opts.values():
        from_env = d.env.get(envvar) if envvar else None
        values[name] = from_env if from_env is not None else default
    for use in d.flags():
        if use.name not in opts or use.value_index in d.unknown_args:
            continue
        name = opts[use.name][0]
        if name == "allow_uid":
            continue  # user names are resolved on the daemon's host, not here
        values[name] = use.value
    values["allow_uid"] = []
    port = values.get("metrics_port")
    if port is not None and not isinstance(port, int):
        if not str(port).isdigit():
            return f"--metrics-port: {port!r} is not a TCP port"
        values["metrics_port"] = int(port)
    params = inspect.signature(build_config).parameters
    kwargs = {k: v for k, v in values.items() if k in params}
    if "supported_backends" in params:
        kwargs["supported_backends"] = LONG_BACKENDS
    try:
        build_config(**kwargs)
    except UsageError as err:
        return err.message
    except TypeError:
        return None  # the daemon's signature moved on; the other checks still run
    return None


@rule(
    "KVD502",
    "daemon-flags",
    Severity.ERROR,
    "The daemon accepts its flags (known flags, sizes, --long-path with --long-bytes, backend settings).",
    "Fix the flag as the message says; `python -m infera.kvd --help` lists them.",
)
def daemon_flags(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Runs the daemon's own flag validation over each `python -m infera.kvd` command: unknown flags, sizes
    that do not parse, `--long-path` without `--long-bytes` (or the reverse), an unknown
    `--long-backend`, `--long-backend mooncake` without `--mooncake-master`, a `--mooncake-protocol`
    other than `tcp` or `rdma`, Mooncake flags without the Mooncake backend.

    ## Why it matters
    The daemon checks its flags at start and exits with a one-line error. Under systemd or Kubernetes
    that is a restart loop, and the engines on the host keep running without kvd.

    ## Example
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G --long-path /nvme/kvd-long
    ```

    Use instead:
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G --long-path /nvme/kvd-long --long-bytes 256G
    ```

    ## Fix
    Follow the message; it is the same one the daemon prints.
    """
    opts = daemon_options()
    for d in dep.daemons:
        if d.argv is None:
            continue
        value_idx = {u.value_index for u in d.flags()}
        for i, arg in enumerate(d.argv[d.args_start :], d.args_start):
            if not arg.startswith("-") and i not in value_idx:
                yield Hit(
                    f"daemon: unexpected argument {arg!r}",
                    d.argv_locs[i] if i < len(d.argv_locs) else d.where(),
                )
                break
        for use in d.flags():
            if use.name not in opts:
                yield Hit(f"daemon: unknown flag {use.name}", d.where_flag(use.name))
        backend = (d.long_backend or "").lower()
        if d.has_flag("--long-path") and backend in DISTRIBUTED:
            continue  # KVD501
        messages: list[tuple[str, Loc | None]] = []
        err = _config_error(d, opts)
        if err:
            named = re.search(r"--[a-z][a-z0-9-]*", err)
            where = d.where_flag(named.group(0)) if named and d.has_flag(named.group(0)) else d.where()
            messages.append((err, where))
        moon = [f for f in MOONCAKE_FLAGS if d.has_flag(f)]
        master = d.has_flag("--mooncake-master") or "INFERA_KVD_MOONCAKE_MASTER" in d.env
        if backend == "mooncake" and not master:
            messages.append(
                ("--long-backend mooncake needs --mooncake-master HOST:PORT", d.where_flag("--long-backend"))
            )
        elif moon and backend != "mooncake":
            messages.append((f"{moon[0]} is ignored without --long-backend mooncake", d.where_flag(moon[0])))
        proto = d.flag_value("--mooncake-protocol")
        if proto is not None and proto not in MOONCAKE_PROTOCOLS:
            messages.append(
                (f"--mooncake-protocol {proto!r} is not tcp or rdma", d.where_flag("--mooncake-protocol"))
            )
        seen: set[str] = set()
        for msg, where in messages:
            key = msg.split(":")[0] if msg.startswith("--mooncake-protocol") else msg[:40]
            if key not in seen:
                seen.add(key)
                yield Hit(f"daemon: {msg}", where)
