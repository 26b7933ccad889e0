"""KVD406-KVD407: GPU-direct roots (``INFERA_KVD_HIPFILE_ROOTS``) of the legs that read chunk files themselves."""

from __future__ import annotations

from collections.abc import Iterator

from infera.engine.vllm import config
from infera.errors import UsageError
from infera.keyrules import AIS_ENV as AIS
from infera.keyrules import ROOTS_ENV as ROOTS
from infera.launch.model import Deployment, Leg, norm_path
from infera.launch.rules.registry import Context, Hit, Severity, rule

SOCKET = "INFERA_KVD_SOCKET"
AIS_ON = ("1", "auto")


def ais_on(leg: Leg) -> bool:
    return (leg.env_value(AIS) or "").strip().lower() in AIS_ON


def parse_roots(text: str) -> dict[str, str] | None:
    """``long=/nvme/kvd-long,scratch=/x`` -> {name: path}, as the connector reads it; None when the
    connector refuses the value (KVD408 reports why)."""
    try:
        return config.parse_roots(text)
    except UsageError:
        return None


@rule(
    "KVD406",
    "ais-needs-hipfile-roots",
    Severity.ERROR,
    "INFERA_KVD_AIS=1|auto comes with INFERA_KVD_HIPFILE_ROOTS.",
    "Add INFERA_KVD_HIPFILE_ROOTS=long=<the daemon's --long-path> next to INFERA_KVD_AIS.",
)
def ais_roots(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds a leg with `INFERA_KVD_AIS` set to `1` or `auto` but no `INFERA_KVD_HIPFILE_ROOTS`.

    ## Why it matters
    GPU-direct L3 has the connector read chunk files itself, under the roots the variable names. With
    no roots there is nothing to read directly, so every L3 read goes through the daemon over POSIX:
    correct, at a fraction of the speed, with no error.

    ## Example
    ```sh
    INFERA_KVD_AIS=1 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    Use instead:
    {{AIS_ENGINE_SH}}

    ## Fix
    `kvd launch single --ais --long-path DIR ...` writes both variables.
    """
    for leg in dep.legs:
        if ais_on(leg) and leg.env_is_unset(ROOTS):
            yield Hit(
                f"leg {leg.name!r} sets INFERA_KVD_AIS={leg.env_value(AIS)} without INFERA_KVD_HIPFILE_ROOTS",
                leg.where_env(AIS),
            )


@rule(
    "KVD407",
    "hipfile-long-root",
    Severity.ERROR,
    "With GPU-direct on, INFERA_KVD_HIPFILE_ROOTS has a long= root equal to the daemon's --long-path.",
    "Set INFERA_KVD_HIPFILE_ROOTS=long=<the daemon's --long-path>.",
)
def long_root(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    On a leg with `INFERA_KVD_AIS` `1` or `auto`, parses `INFERA_KVD_HIPFILE_ROOTS` (`name=path[,...]`)
    and checks that it has a `long=` root, that the daemon it talks to has a disk tier (`--long-path`),
    and that the two paths are the same directory.

    ## Why it matters
    The connector reads chunk files from the `long=` root directly, bypassing the daemon; the daemon
    writes them under `--long-path`. A different directory means GPU-direct never finds a chunk and
    every read falls back to POSIX. A daemon with a distributed long tier, or none, has no chunk files
    to read.

    ## Example
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G --long-path /nvme/kvd-long --long-bytes 256G &
    INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd \\
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    Use instead:
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G --long-path /nvme/kvd-long --long-bytes 256G &
    INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long \\
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    ## Fix
    Use the same path for `--long-path` and the `long=` root; in a container, mount it at the same path.
    """
    for leg in dep.legs:
        text = leg.env_value(ROOTS)
        if not ais_on(leg) or text is None:
            continue
        roots = parse_roots(text)
        if roots is None:
            continue  # KVD408 reports the syntax
        loc = leg.where_env(ROOTS)
        if "long" not in roots:
            yield Hit(f"INFERA_KVD_HIPFILE_ROOTS={text} on leg {leg.name!r} has no long= root", loc)
            continue
        d = dep.daemon_for(leg.env_value(SOCKET))
        if d is None or d.argv is None:
            continue
        if d.long_path is None:
            if not d.has_flag("--long-path"):
                yield Hit(
                    f"leg {leg.name!r} reads GPU-direct from {roots['long']}, but the daemon has no disk tier "
                    "(--long-path)",
                    loc,
                )
            continue
        if norm_path(roots["long"]) != norm_path(d.long_path):
            yield Hit(
                f"INFERA_KVD_HIPFILE_ROOTS long={roots['long']} on leg {leg.name!r}, but the daemon's "
                f"--long-path is {d.long_path}",
                loc,
            )
