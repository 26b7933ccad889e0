"""KVD5xx: the daemon's own flags, checked with the daemon's flag table (:mod:`infera.kvd.flags`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from infera.kvd import flags
from infera.kvd.flags import DISTRIBUTED, UNKNOWN, FlagValues
from infera.launch.model import Daemon, Deployment
from infera.launch.rules.registry import Context, Hit, Severity, rule


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


def daemon_values(d: Daemon) -> FlagValues:
    """``d``'s flag values as the daemon would read them: the command line, else the environment
    variable, else the table's default; UNKNOWN where the linter cannot see the value."""
    values: dict[str, Any] = {}
    given: set[str] = set()
    uses = [u for u in d.flags() if u.name in flags.BY_NAME]
    for f in flags.FLAGS:
        mine = [u for u in uses if u.name == f.name]
        if mine:
            given.add(f.name)
            if f.kind == "switch":
                values[f.dest] = True
            elif any(u.value_index in d.unknown_args for u in mine):
                values[f.dest] = UNKNOWN
            elif f.kind == "list":
                values[f.dest] = [u.value for u in mine if u.value is not None]
            else:
                values[f.dest] = mine[-1].value
        elif f.env and f.env in d.env:
            env = d.env[f.env]
            if env is None:
                values[f.dest] = UNKNOWN
            elif env != "":  # the daemon, like click, skips an empty variable
                values[f.dest] = env
        elif f.env and not d.env_complete:
            values[f.dest] = UNKNOWN
    return FlagValues(values, frozenset(given))


@rule(
    "KVD502",
    "daemon-flags",
    Severity.ERROR,
    "The daemon accepts its flags: every value passes the flag's own check, and the flags fit together.",
    "Fix the flag as the message says; `python -m infera.kvd --help` lists them.",
)
def daemon_flags(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks each `python -m infera.kvd` command with the daemon's own flag table, the one `kvd serve`
    validates with: unknown flags and stray arguments; every value, given as a flag or through its
    environment variable (`INFERA_KVD_MOONCAKE_*`, `INFERA_KVD_LMCACHE_URL`, `INFERA_KVD_SOCKET`), through
    that flag's validator (sizes such as `--max-bytes 12Q`, `--fsync maybe`, `--socket-mode 999`,
    `--ephemeral-ttl forever`, `--busy-poll-us -5`, `--mooncake-master nohost`, ...); then the rules
    between flags: `--long-path` without `--long-bytes` (or the reverse), `--long-backend mooncake`
    without `--mooncake-master`, `--long-backend lmcache` without `--lmcache-url`, and Mooncake or
    LMCache flags without their backend. The message is the one the daemon prints. A value the linter
    cannot see (`$VAR`, an environment file) is not checked.

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
            f = flags.BY_NAME.get(use.name)
            if f is None:
                yield Hit(f"daemon: unknown flag {use.name}", d.where_flag(use.name))
            elif f.kind == "switch" and use.value is not None:
                yield Hit(f"daemon: {f.name} takes no value", d.where_flag(use.name))
            elif f.kind != "switch" and use.value is None:
                yield Hit(f"daemon: {f.name} needs a value", d.where_flag(use.name))
        backend = (d.long_backend or "").lower()
        if d.has_flag("--long-path") and backend in DISTRIBUTED:
            continue  # KVD501
        for p in flags.check(daemon_values(d)).problems:
            f = flags.BY_NAME.get(p.flag or "")
            if p.flag and d.has_flag(p.flag):
                where = d.where_flag(p.flag)
            elif f is not None and f.env and f.env in d.env:
                where = d.where_env(f.env)
            else:
                where = d.where()
            yield Hit(f"daemon: {p.message}", where)
