"""The daemon's flags: one table that ``kvd serve``, ``kvd launch``, ``kvd lint`` and ``kvd doctor`` use.

Each :class:`Flag` holds a flag's name, kind, default (as typed on a command line), environment
variable, help and validator. :func:`check` validates a full set of values once for everyone: each
flag with its own validator, then the rules between flags (the long tier and its settings).
``build_config`` raises the first problem, ``kvd lint`` reports each one, ``kvd launch`` refuses the
first. :mod:`infera.kvd.flagopts` turns the table into Typer options.

Only the standard library, :mod:`infera.errors` and the units of :mod:`infera.units` are
imported here, so the tools read the table without loading the daemon's runtime modules.

Adding a flag is one entry in :data:`FLAGS` (with an example of a bad value, for the tests), plus
the :class:`~infera.kvd.config.DaemonConfig` field of the same name that the daemon reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from infera.errors import UsageError
from infera.units import parse_duration, parse_size

LONG_BACKENDS = ("disk", "mooncake", "lmcache")
DISTRIBUTED = ("mooncake", "lmcache")
MIN_ARENA = 1 << 20
MAX_SOCKET_PATH = 108  # bytes of sun_path on Linux
METADATA_SCHEMES = ("http://", "https://", "etcd://", "redis://")

Kind = Literal["value", "list", "switch"]
Parse = Callable[[Any, str], Any]


class _Unknown:
    """A value a tool cannot see (a ``$VAR`` of the caller, a Kubernetes ``valueFrom``)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


# -- validators: (value as typed, flag name) -> the value the daemon uses; UsageError naming the flag --


def size(minimum: int = 0, label: str = "") -> Parse:
    def parse(value: Any, flag: str) -> int:
        n = parse_size(value, flag)
        if n < minimum:
            raise UsageError(f"{flag}: {value} is below the {label} minimum")
        return n

    return parse


def choice(names: tuple[str, ...], upper: bool = False) -> Parse:
    listed = f"{names[0]} or {names[1]}" if len(names) == 2 else f"one of {', '.join(names)}"

    def parse(value: Any, flag: str) -> str:
        text = str(value).lower()
        if text not in names:
            raise UsageError(f"{flag}: {value!r} is not {listed}")
        return text.upper() if upper else text

    return parse


def int_range(lo: int, hi: int) -> Parse:
    def parse(value: Any, flag: str) -> int:
        text = str(value).strip()
        if not re.fullmatch(r"-?\d+", text) or not lo <= int(text) <= hi:
            raise UsageError(f"{flag}: {value!r} is not a whole number between {lo} and {hi}")
        return int(text)

    return parse


def tcp_port(value: Any, flag: str) -> int:
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"{flag}: {value} is not a TCP port")
    return int(text)


def duration(value: Any, flag: str) -> float:
    return parse_duration(value, flag)


def octal_mode(value: Any, flag: str) -> int:
    try:
        mode = int(str(value), 8)
    except ValueError:
        raise UsageError(f"{flag}: {value!r} is not an octal mode", hint="e.g. 0660 or 0600") from None
    if not 0 <= mode <= 0o777:
        raise UsageError(f"{flag}: {value!r} is out of range")
    return mode


def text(value: Any, flag: str) -> str:
    return str(value)


def directory(value: Any, flag: str) -> str:
    return os.path.expanduser(str(value))


def socket_path(value: Any, flag: str) -> str:
    n = len(os.fsencode(str(value)))
    if n > MAX_SOCKET_PATH:
        raise UsageError(
            f"{flag}: the path is {n} bytes; a Unix socket path has at most {MAX_SOCKET_PATH}",
            hint="use a shorter directory, e.g. /run/infera-kvd.sock",
        )
    return str(value)


_USER = re.compile(r"[A-Za-z0-9_.@][A-Za-z0-9_.@-]*\$?")


@dataclass(frozen=True)
class Uids:
    """``--allow-uid`` values: numeric uids, user names (resolved on the daemon's host), or anyone."""

    uids: frozenset[int] = frozenset()
    names: tuple[str, ...] = ()
    anyone: bool = False


def uid_list(values: Any, flag: str) -> Uids:
    uids: set[int] = set()
    names: list[str] = []
    anyone = False
    for raw in [values] if isinstance(values, str) else values:
        for item in (i.strip() for i in str(raw).split(",")):
            if not item:
                continue
            if item == "*":
                anyone = True
            elif item.isdigit():
                uids.add(int(item))
            elif _USER.fullmatch(item):
                names.append(item)
            else:
                raise UsageError(f"{flag}: {item!r} is not a uid, a user name or '*'")
    return Uids(frozenset(uids), tuple(names), anyone)


def parse_master(master: str) -> tuple[str, int]:
    """(host, port) of a Mooncake master: ``HOST:PORT``, or the first endpoint of ``etcd://A,B`` (``,`` or ``;``)."""
    target = master.split("://", 1)[1] if "://" in master else master
    target = re.split(r"[,;]", target, maxsplit=1)[0]
    host, sep, port = target.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--mooncake-master: {master!r} is not HOST:PORT", hint="e.g. 10.0.0.5:50051")
    return host.strip("[]"), int(port)


def master_address(value: Any, flag: str) -> str:
    parse_master(str(value))
    return str(value)


def metadata_url(value: Any, flag: str) -> str:
    meta = str(value)
    if meta != "P2PHANDSHAKE" and not meta.startswith(METADATA_SCHEMES):
        raise UsageError(
            f"{flag}: {meta!r} is not a metadata service URL",
            hint="http://HOST:PORT/metadata (the master's --enable_http_metadata_server), "
            "etcd://HOST:PORT, redis://HOST:PORT or P2PHANDSHAKE",
        )
    return meta


def lm_url(value: Any, flag: str) -> str:
    url = str(value)
    rest = url[len("lm://") :] if url.startswith("lm://") else None
    host, sep, port = (rest or "").rpartition(":")
    if rest is None or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag}: {url!r} is not lm://HOST:PORT", hint="e.g. lm://10.0.0.5:65432")
    return url


def switch(value: Any, flag: str) -> bool:
    return bool(value)


# -- the table --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One daemon flag. ``default`` is written as on a command line; None means not set."""

    name: str
    help: str
    parse: Parse
    default: str | None = None
    env: str | None = None
    kind: Kind = "value"
    metavar: str = "TEXT"
    default_text: str | None = None  # the help's [default: ...] when the daemon computes it
    backend: str | None = None  # only read with this --long-backend; refused on the command line without it
    bad: str | None = None  # a value the validator refuses (the tests feed it to every tool)
    no_bad: str = ""  # why no value can be bad, when ``bad`` is None
    doctor: bool = False  # `kvd doctor` takes it too

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    def argv(self, value: Any) -> list[str]:
        """The command-line words that pass ``value`` (none for an unset value or a switch left off)."""
        if self.kind == "switch":
            return [self.name] if value else []
        if self.kind == "list":
            return [w for v in value or () for w in (self.name, str(v))]
        return [] if value is None else [self.name, str(value)]


def _mooncake(
    name: str,
    help: str,
    parse: Parse,
    metavar: str,
    bad: str,
    default: str | None = None,
    doctor: bool = False,
) -> Flag:
    env = "INFERA_KVD_" + name[2:].replace("-", "_").upper()
    return Flag(name, help, parse, default, env, metavar=metavar, backend="mooncake", bad=bad, doctor=doctor)


FLAGS: tuple[Flag, ...] = (
    Flag(
        "--socket",
        "Unix socket path the clients connect to.",
        socket_path,
        env="INFERA_KVD_SOCKET",
        metavar="PATH",
        default_text="$INFERA_KVD_SOCKET, else $XDG_RUNTIME_DIR/infera-kvd.sock, else /tmp/infera-kvd-UID/kvd.sock",
        bad="/run/" + "k" * 110 + ".sock",
        doctor=True,
    ),
    Flag(
        "--max-bytes",
        "RAM arena size (binary units: 512M, 16G, 1T; at least 1M).",
        size(MIN_ARENA, "1M"),
        "1G",
        metavar="SIZE",
        bad="12Q",
        doctor=True,
    ),
    Flag(
        "--long-path",
        "Directory of the disk long tier (L3); needs --long-bytes.",
        directory,
        metavar="DIR",
        bad="",
        doctor=True,
    ),
    Flag(
        "--long-bytes",
        "Capacity of the disk long tier, e.g. 256G (at least 1M).",
        size(MIN_ARENA, "1M"),
        metavar="SIZE",
        bad="10K",
    ),
    Flag(
        "--long-backend",
        "Long tier backend: disk (implied by --long-path), mooncake or lmcache; disk or distributed, never both.",
        choice(LONG_BACKENDS),
        metavar="NAME",
        bad="floppy",
        doctor=True,
    ),
    Flag(
        "--socket-mode",
        "Permissions of the socket file (octal).",
        octal_mode,
        "0660",
        metavar="MODE",
        bad="999",
    ),
    Flag(
        "--allow-uid",
        "Also accept clients of this uid or user name (repeatable, comma lists allowed; '*' for anyone). "
        "The daemon's own uid is always accepted.",
        uid_list,
        kind="list",
        metavar="UID",
        bad="root:0",
        doctor=True,
    ),
    Flag(
        "--log-level",
        "debug, info, warning or error.",
        choice(("debug", "info", "warning", "error"), upper=True),
        "info",
        metavar="LEVEL",
        bad="loud",
    ),
    Flag(
        "--metrics-port",
        "Serve Prometheus metrics on 127.0.0.1:PORT (off by default).",
        tcp_port,
        metavar="PORT",
        bad="70000",
    ),
    Flag(
        "--ephemeral-ttl",
        "Lifetime of `ephemeral` chunks (300s, 5m, 1h).",
        duration,
        "300s",
        metavar="DURATION",
        bad="forever",
    ),
    Flag(
        "--fsync",
        "Disk tier durability: none, data (fdatasync each file) or always.",
        choice(("none", "data", "always")),
        "data",
        metavar="MODE",
        bad="maybe",
    ),
    _mooncake(
        "--mooncake-master",
        "Mooncake master RPC address HOST:PORT (or etcd://HOST:PORT for an HA master); "
        "needed with --long-backend mooncake.",
        master_address,
        "HOST:PORT",
        "nohost",
    ),
    _mooncake(
        "--mooncake-metadata",
        "Mooncake metadata service: http://HOST:PORT/metadata, etcd://HOST:PORT, redis://HOST:PORT "
        "or P2PHANDSHAKE.",
        metadata_url,
        "URL",
        "ftp://x",
        "P2PHANDSHAKE",
    ),
    _mooncake(
        "--mooncake-protocol", "tcp or rdma.", choice(("tcp", "rdma")), "NAME", "udp", "tcp", doctor=True
    ),
    _mooncake("--mooncake-device", "RDMA device names, e.g. mlx5_0,mlx5_1.", text, "NAMES", ""),
    _mooncake(
        "--mooncake-segment-bytes",
        "Memory this daemon lends to the Mooncake pool (0: the data lives on storage nodes).",
        size(),
        "SIZE",
        "lots",
        "0",
        doctor=True,
    ),
    _mooncake(
        "--mooncake-buffer-bytes",
        "Mooncake client transfer buffer.",
        size(),
        "SIZE",
        "lots",
        "16M",
        doctor=True,
    ),
    Flag(
        "--lmcache-url",
        "lmcache_server address lm://HOST:PORT; needed with --long-backend lmcache.",
        lm_url,
        env="INFERA_KVD_LMCACHE_URL",
        metavar="URL",
        backend="lmcache",
        bad="http://h:1",
    ),
    Flag(
        "--busy-poll-us",
        "After traffic, poll for this many microseconds before sleeping (lower latency, a little CPU; 0 = off).",
        int_range(0, 100_000),
        "1000",
        metavar="N",
        bad="-5",
    ),
    Flag(
        "--prefault",
        "Commit the whole arena at start (in the background) so first writes pay no page faults.",
        switch,
        kind="switch",
        bad="yes",  # a switch takes no value: `--prefault=yes` is refused
    ),
)

BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
BY_DEST: dict[str, Flag] = {f.dest: f for f in FLAGS}
SWITCHES: frozenset[str] = frozenset(f.name for f in FLAGS if f.kind == "switch")


# -- checking a full set of values ----------------------------------------------------------------


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
