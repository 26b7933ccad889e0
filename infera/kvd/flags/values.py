"""A full set of flag values, checked once for every tool: each flag's validator, then the rules between flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infera.errors import UsageError
from infera.kvd.flags.parse import DISTRIBUTED, LONG_BACKENDS, UNKNOWN
from infera.kvd.flags.table import BY_DEST, FLAGS


@dataclass(frozen=True)
class Problem:
    """One thing the daemon would refuse: the flag it is about (None: the set as a whole) and the error."""

    flag: str | None
    error: UsageError

    @property
    def message(self) -> str:
        return self.error.message


@dataclass
class Checked:
    """The values the daemon uses (by ``dest``), the long tier it gets, and every problem found."""

    values: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    problems: list[Problem] = field(default_factory=list)

    def raise_first(self) -> None:
        if self.problems:
            raise self.problems[0].error


@dataclass(frozen=True)
class FlagValues:
    """Flag values as typed (by ``dest``; missing ones take the table's default) and the names given
    on the command line (as opposed to the environment or the default)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, **values: Any) -> FlagValues:
        """Values as if typed on a command line (each one that is set counts as given)."""
        unknown = set(values) - set(BY_DEST)
        if unknown:
            raise TypeError(f"not daemon flags: {', '.join(sorted(unknown))}")
        return cls(values, frozenset(BY_DEST[k].name for k, v in values.items() if _present(v)))

    def get(self, dest: str) -> Any:
        f = BY_DEST[dest]
        return self.values.get(dest, [] if f.kind == "list" else False if f.kind == "switch" else f.default)


def _present(v: Any) -> bool:
    return v is not None and v != [] and v is not False


def check(values: FlagValues, together: bool = True) -> Checked:
    """Validate ``values``: each flag with its validator, then (``together``) the rules between flags.

    A flag of one backend is read only with that ``--long-backend`` (the daemon ignores it
    otherwise, so a stray environment variable does no harm); on the command line without it, it is
    a problem. ``UNKNOWN`` values are taken as present and valid.
    """
    out = Checked()
    raw = {f.dest: values.get(f.dest) for f in FLAGS}
    backend = _backend(raw["long_backend"], raw["long_path"])
    for f in FLAGS:
        value = raw[f.dest]
        if f.backend and backend is not UNKNOWN and backend != f.backend:
            if f.name in values.given:
                err = UsageError(
                    f"{f.name} needs --long-backend {f.backend}",
                    hint=f"the daemon reads it only with the {f.backend} long tier",
                )
                out.problems.append(Problem(f.name, err))
            out.values[f.dest] = None
            continue
        if value is UNKNOWN or not _present(value):
            out.values[f.dest] = value if value is UNKNOWN else None
            continue
        if f.kind == "value" and str(value) == "":
            out.problems.append(Problem(f.name, UsageError(f"{f.name}: empty value")))
            out.values[f.dest] = UNKNOWN
            continue
        try:
            out.values[f.dest] = f.parse(value, f.name)
        except UsageError as err:
            out.problems.append(Problem(f.name, err))
            out.values[f.dest] = UNKNOWN
    out.backend = backend
    if together:
        out.problems += _together(out.values, backend)
    return out


def _backend(long_backend: Any, long_path: Any) -> Any:
    """The long tier the values pick: a backend name, None (RAM only) or UNKNOWN."""
    if long_backend is UNKNOWN:
        return UNKNOWN
    if long_backend is not None:
        name = str(long_backend).lower()
        return name if name in LONG_BACKENDS else UNKNOWN
    return "disk" if _present(long_path) else None


def _together(v: dict[str, Any], backend: str | None) -> list[Problem]:
    """The rules between flags: one long tier, sized, with its backend's address."""
    if backend is UNKNOWN:
        return []
    path, nbytes = v["long_path"], v["long_bytes"]
    if backend in DISTRIBUTED and path is not None:
        err = UsageError(
            f"--long-path and --long-backend {backend} cannot be combined: the long tier is disk or "
            "distributed, never both",
            hint="drop --long-path to use the distributed store, or drop --long-backend to use local disk",
        )
        return [Problem("--long-backend", err)]
    out: list[Problem] = []
    if backend == "disk" and path is None:
        out.append(Problem("--long-backend", UsageError("--long-backend disk needs --long-path DIR")))
    if nbytes is not None and backend != "disk":
        out.append(
            Problem("--long-bytes", UsageError("--long-bytes needs --long-path (it sizes the disk tier)"))
        )
    if backend == "disk" and path is not None and nbytes is None:
        err = UsageError("--long-path needs --long-bytes (the disk tier's capacity, e.g. 256G)")
        out.append(Problem("--long-path", err))
    if backend == "mooncake" and v["mooncake_master"] is None:
        err = UsageError(
            "--long-backend mooncake needs --mooncake-master HOST:PORT",
            hint="the address of mooncake_master's RPC port, or etcd://HOST:PORT for an HA master; "
            "also read from INFERA_KVD_MOONCAKE_MASTER",
        )
        out.append(Problem("--long-backend", err))
    if backend == "lmcache" and v["lmcache_url"] is None:
        err = UsageError(
            "--long-backend lmcache needs --lmcache-url lm://HOST:PORT",
            hint="the address of a running lmcache_server; also read from INFERA_KVD_LMCACHE_URL",
        )
        out.append(Problem("--long-backend", err))
    return out
