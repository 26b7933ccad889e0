"""Daemon settings, validated once at start so every mistake is a one-line error."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from infera.errors import UsageError
from infera.kvd.protocol import default_socket_path
from infera.units import parse_duration, parse_size

LONG_BACKENDS = ("disk", "mooncake", "lmcache")
MIN_ARENA = 1 << 20


@dataclass
class DaemonConfig:
    socket: str = field(default_factory=default_socket_path)
    max_bytes: int = 1 << 30
    long_path: str | None = None
    long_bytes: int | None = None
    long_backend: str | None = None
    socket_mode: int = 0o660
    allow_uids: set[int] | None = None  # None: only the daemon's own uid; empty set never used
    allow_any_uid: bool = False
    log_level: str = "INFO"
    metrics_port: int | None = None
    ephemeral_ttl: float = 300.0
    max_frame: int = 16 << 20
    fsync: str = "data"
    prefault: bool = False
    busy_poll_us: int = 1000
    long_write_queue: int = 256
    long_writers: int = 2
    mooncake_master: str | None = None
    mooncake_metadata: str = "P2PHANDSHAKE"
    mooncake_protocol: str = "tcp"
    mooncake_device: str = ""
    mooncake_segment_bytes: int = 0
    mooncake_buffer_bytes: int = 16 << 20
    lmcache_url: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def allowed(self, uid: int) -> bool:
        if self.allow_any_uid or uid == os.getuid():
            return True
        return self.allow_uids is not None and uid in self.allow_uids


def parse_uid_list(values: list[str]) -> tuple[set[int], bool]:
    """Parse ``--allow-uid`` values: numbers, user names, or ``*`` for anyone."""
    import pwd

    uids: set[int] = set()
    anyone = False
    for raw in values:
        for item in str(raw).split(","):
            item = item.strip()
            if not item:
                continue
            if item == "*":
                anyone = True
            elif item.isdigit():
                uids.add(int(item))
            else:
                try:
                    uids.add(pwd.getpwnam(item).pw_uid)
                except KeyError:
                    raise UsageError(f"--allow-uid: no such user {item!r}") from None
    return uids, anyone


def parse_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise UsageError(f"--socket-mode: {text!r} is not an octal mode", hint="e.g. 0660 or 0600") from None
    if not 0 <= mode <= 0o777:
        raise UsageError(f"--socket-mode: {text!r} is out of range")
    return mode


def build_config(
    *,
    socket: str | None,
    max_bytes: str,
    long_path: str | None,
    long_bytes: str | None,
    long_backend: str | None,
    socket_mode: str,
    allow_uid: list[str],
    log_level: str,
    metrics_port: int | None,
    ephemeral_ttl: str,
    fsync: str = "data",
    supported_backends: tuple[str, ...] = (),
    mooncake_master: str | None = None,
    mooncake_metadata: str | None = None,
    mooncake_protocol: str | None = None,
    mooncake_device: str | None = None,
    mooncake_segment_bytes: str | None = None,
    mooncake_buffer_bytes: str | None = None,
    lmcache_url: str | None = None,
) -> DaemonConfig:
    """Validate flag values into a DaemonConfig (raises UsageError with a one-line message)."""
    cfg = DaemonConfig()
    cfg.socket = socket or default_socket_path()
    cfg.max_bytes = parse_size(max_bytes, "--max-bytes")
    if cfg.max_bytes < MIN_ARENA:
        raise UsageError(f"--max-bytes: {max_bytes} is below the 1M minimum")
    cfg.socket_mode = parse_mode(socket_mode)
    uids, anyone = parse_uid_list(allow_uid)
    cfg.allow_uids = uids or None
    cfg.allow_any_uid = anyone
    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError(f"--log-level: {log_level!r} is not one of debug, info, warning, error")
    cfg.log_level = level
    if metrics_port is not None and not 0 < metrics_port < 65536:
        raise UsageError(f"--metrics-port: {metrics_port} is not a TCP port")
    cfg.metrics_port = metrics_port
    cfg.ephemeral_ttl = parse_duration(ephemeral_ttl, "--ephemeral-ttl")
    if fsync not in ("none", "data", "always"):
        raise UsageError(f"--fsync: {fsync!r} is not one of none, data, always")
    cfg.fsync = fsync

    backend = long_backend.lower() if long_backend else None
    if backend is not None and backend not in LONG_BACKENDS:
        raise UsageError(
            f"--long-backend: {long_backend!r} is not one of {', '.join(LONG_BACKENDS)}",
        )
    if backend in ("mooncake", "lmcache") and long_path:
        raise UsageError(
            f"--long-path and --long-backend {backend} cannot be combined: the long tier is disk or "
            "distributed, never both",
            hint="drop --long-path to use the distributed store, or drop --long-backend to use local disk",
        )
    if long_path and backend is None:
        backend = "disk"
    if backend == "disk" and not long_path:
        raise UsageError("--long-backend disk needs --long-path DIR")
    if long_bytes is not None and backend != "disk":
        raise UsageError("--long-bytes needs --long-path (it sizes the disk tier)")
    if backend == "disk":
        assert long_path is not None
        cfg.long_path = str(Path(long_path).expanduser())
        if long_bytes is None:
            raise UsageError("--long-path needs --long-bytes (the disk tier's capacity, e.g. 256G)")
        cfg.long_bytes = parse_size(long_bytes, "--long-bytes")
        if cfg.long_bytes < MIN_ARENA:
            raise UsageError(f"--long-bytes: {long_bytes} is below the 1M minimum")
    cfg.long_backend = backend
    if backend == "mooncake":
        _mooncake_config(
            cfg,
            mooncake_master,
            mooncake_metadata,
            mooncake_protocol,
            mooncake_device,
            mooncake_segment_bytes,
            mooncake_buffer_bytes,
        )
    elif backend == "lmcache":
        cfg.lmcache_url = _lmcache_url(lmcache_url)
    if backend is not None and backend not in supported_backends:
        raise UsageError(
            f"the {backend!r} long tier is not available in this build of infera-kvd",
            hint="run with the RAM tier only (drop --long-path/--long-backend) until it lands",
        )
    return cfg


METADATA_SCHEMES = ("http://", "https://", "etcd://", "redis://")


def _mooncake_config(
    cfg: DaemonConfig,
    master: str | None,
    metadata: str | None,
    protocol: str | None,
    device: str | None,
    segment: str | None,
    buffer: str | None,
) -> None:
    """Validate the ``--mooncake-*`` flags (each also read from ``INFERA_KVD_MOONCAKE_*``)."""
    if not master:
        raise UsageError(
            "--long-backend mooncake needs --mooncake-master HOST:PORT",
            hint="the address of mooncake_master's RPC port, or etcd://HOST:PORT for an HA master; "
            "also read from INFERA_KVD_MOONCAKE_MASTER",
        )
    target = master.split("://", 1)[1] if "://" in master else master
    host, sep, port = target.split(",", 1)[0].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--mooncake-master: {master!r} is not HOST:PORT", hint="e.g. 10.0.0.5:50051")
    cfg.mooncake_master = master
    meta = metadata or "P2PHANDSHAKE"
    if meta != "P2PHANDSHAKE" and not meta.startswith(METADATA_SCHEMES):
        raise UsageError(
            f"--mooncake-metadata: {meta!r} is not a metadata service URL",
            hint="http://HOST:PORT/metadata (the master's --enable_http_metadata_server), "
            "etcd://HOST:PORT, redis://HOST:PORT or P2PHANDSHAKE",
        )
    cfg.mooncake_metadata = meta
    proto = (protocol or "tcp").lower()
    if proto not in ("tcp", "rdma"):
        raise UsageError(f"--mooncake-protocol: {protocol!r} is not tcp or rdma")
    cfg.mooncake_protocol = proto
    cfg.mooncake_device = device or ""
    if segment is not None:
        cfg.mooncake_segment_bytes = parse_size(segment, "--mooncake-segment-bytes")
    if buffer is not None:
        cfg.mooncake_buffer_bytes = parse_size(buffer, "--mooncake-buffer-bytes")


def _lmcache_url(url: str | None) -> str:
    if not url:
        raise UsageError(
            "--long-backend lmcache needs --lmcache-url lm://HOST:PORT",
            hint="the address of a running lmcache_server; also read from INFERA_KVD_LMCACHE_URL",
        )
    rest = url[len("lm://") :] if url.startswith("lm://") else None
    host, sep, port = (rest or "").rpartition(":")
    if rest is None or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--lmcache-url: {url!r} is not lm://HOST:PORT", hint="e.g. lm://10.0.0.5:65432")
    return url
