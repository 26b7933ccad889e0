"""The table of the daemon's flags: one :class:`Flag` each, by name and by destination."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infera.kvd.flags.parse import (
    LONG_BACKENDS,
    MIN_ARENA,
    Kind,
    Parse,
    choice,
    directory,
    duration,
    int_range,
    lm_url,
    master_address,
    metadata_url,
    octal_mode,
    percent,
    size,
    socket_path,
    switch,
    tcp_port,
    text,
    uid_list,
)


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
        "Directory of the disk long tier (L3); the daemon takes it with --long-bytes.",
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
        "--client-quota",
        "The most of the arena one connection may pin at once with its leases, LOOKUP holds and "
        "unsealed reservations, in percent (1-100; 100: no limit). Past it its writes and holds are "
        "refused, not the others'.",
        percent,
        "50",
        metavar="PERCENT",
        bad="0",
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
        "After traffic, poll for this many microseconds before sleeping, while the host has a CPU to spare "
        "(lower latency, a little CPU; 0 = off).",
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
