"""Daemon settings, validated once at start (through the flag table of :mod:`infera.kvd.flags`, the
environment-only settings of :mod:`infera.kvd.envvars` and what can be checked of ``--long-path``
on this host) so every mistake is a one-line error."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from infera.errors import UsageError
from infera.kvd import envvars
from infera.kvd.flags import FLAGS, FlagValues, Uids, check
from infera.kvd.protocol import default_socket_path


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
    client_quota: int = 50  # percent of the arena one connection may pin (infera.kvd.budget)
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

    def allowed(self, uid: int) -> bool:
        if self.allow_any_uid or uid == os.getuid():
            return True
        return self.allow_uids is not None and uid in self.allow_uids


def resolve_uids(spec: Uids) -> tuple[set[int], bool]:
    """The uids of ``--allow-uid`` (user names looked up on this host) and whether anyone may connect."""
    import pwd

    uids = set(spec.uids)
    for name in spec.names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise UsageError(f"--allow-uid: no such user {name!r}") from None
    return uids, spec.anyone


def build_config(values: FlagValues | None = None, /, **typed: Any) -> DaemonConfig:
    """Validate flag values into a DaemonConfig (raises UsageError with a one-line message).

    ``values`` come from the command line (``kvd serve``); keyword arguments, by flag ``dest``, are
    taken as given on a command line. Missing flags take the table's default.
    """
    if values is None:
        values = FlagValues.of(**typed)
    elif typed:
        raise TypeError("give flag values or keyword arguments, not both")
    checked = check(values)
    checked.raise_first()
    cfg = DaemonConfig()
    for flag in FLAGS:
        value = checked.values[flag.dest]
        if flag.dest == "allow_uid":
            uids, cfg.allow_any_uid = resolve_uids(value or Uids())
            cfg.allow_uids = uids or None
        elif value is not None:
            setattr(cfg, flag.dest, value)
    cfg.long_backend = checked.backend
    if cfg.long_backend == "disk" and cfg.long_path is not None:
        check_long_path(cfg.long_path)
    envvars.check(cfg.long_backend)
    return cfg


def check_long_path(path: str) -> None:
    """``--long-path`` must be a directory or a path one can be made at: a file there (or in the
    way of one, as an ancestor) is a UsageError. The flag table cannot check it (launch and lint
    read flags meant for another host); the daemon checks it on its own host."""
    probe = os.path.abspath(path)
    while True:
        try:
            mode = os.stat(probe).st_mode
        except (FileNotFoundError, NotADirectoryError):  # not there yet, or under a file: go up
            parent = os.path.dirname(probe)
            if parent == probe:
                return
            probe = parent
            continue
        except OSError:
            return  # unreadable: the disk tier says why when it opens the directory
        if stat.S_ISDIR(mode):
            return
        what = "a regular file" if stat.S_ISREG(mode) else "not a directory"
        where = path if probe == os.path.abspath(path) else f"{path}: {probe}"
        raise UsageError(
            f"--long-path {where} is {what}, not a directory",
            hint="give the disk tier a directory of its own (it is created if missing)",
        )
