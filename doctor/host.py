"""The host view: every file a check reads goes through here, rooted at ``--root``.

Reads are cached, never raise for a missing or unreadable file, and remember *why* a read failed
so a check can say "unknown: permission denied" instead of guessing.
"""

from __future__ import annotations

import errno
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

MAX_READ = 8 << 20


@dataclass(frozen=True)
class FileRead:
    """The outcome of reading one host file: ``text`` or an ``error`` ("missing", "permission denied", ...)."""

    path: str
    text: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.text is not None


class HostView:
    """Files of the host at ``root`` (``/`` for this machine, a fixture tree or a mounted host)."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root).resolve()
        self._cache: dict[tuple[str, bool, int | None], FileRead] = {}

    @property
    def live(self) -> bool:
        """True when the view is this machine's own filesystem (so live probes make sense)."""
        return self.root == Path("/")

    def path(self, p: str) -> Path:
        """The real path of host path ``p`` (absolute, as on the host)."""
        return self.root / p.lstrip("/")

    def display(self, p: str) -> str:
        """How evidence names a host path: as on the host (the report header shows the root)."""
        return p

    def read(self, p: str, *, gz: bool = False, limit: int | None = MAX_READ) -> FileRead:
        """Read host file ``p`` (at most ``limit`` bytes; None reads it all, e.g. /proc/kallsyms)."""
        key = (p, gz, limit)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        real = self.path(p)
        try:
            if gz:
                with gzip.open(real, "rb") as fh:
                    data = fh.read(-1 if limit is None else limit)
            else:
                with open(real, "rb") as fh:
                    data = fh.read(-1 if limit is None else limit)
            res = FileRead(p, data.decode("utf-8", errors="replace"))
        except FileNotFoundError:
            res = FileRead(p, None, "missing")
        except PermissionError:
            res = FileRead(p, None, "permission denied")
        except IsADirectoryError:
            res = FileRead(p, None, "is a directory")
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            err = getattr(exc, "errno", None)
            res = FileRead(p, None, os.strerror(err) if err else str(exc) or type(exc).__name__)
        self._cache[key] = res
        return res

    def text(self, p: str) -> str | None:
        return self.read(p).text

    def value(self, p: str) -> str | None:
        """A one-value sysfs/procfs attribute, stripped; None when unreadable."""
        t = self.read(p).text
        return None if t is None else t.strip()

    def exists(self, p: str) -> bool:
        return os.path.lexists(self.path(p))

    def is_dir(self, p: str) -> bool:
        return self.path(p).is_dir()

    def listdir(self, p: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(p)))
        except OSError:
            return []

    def readlink(self, p: str) -> str | None:
        try:
            return os.readlink(self.path(p))
        except OSError:
            return None

    def resolve(self, p: str) -> str:
        """Host path ``p`` with symlinks followed, without leaving the root for relative links.

        Absolute link targets are taken as host paths (re-rooted), which is what a mounted host
        tree needs; sysfs only uses relative links.
        """
        parts = [x for x in p.split("/") if x]
        out: list[str] = []
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                if out:
                    out.pop()
                continue
            cur = "/" + "/".join([*out, name])
            target = self.readlink(cur)
            if target is None:
                out.append(name)
                continue
            hops += 1
            if hops > 40:
                raise OSError(errno.ELOOP, "too many symbolic links", p)
            if target.startswith("/"):
                out = []
            parts = [x for x in target.split("/") if x] + parts
        return "/" + "/".join(out)

    def kernel_release(self) -> str | None:
        """``uname -r`` of the host: from procfs, so fixture trees and mounted hosts answer too."""
        rel = self.value("/proc/sys/kernel/osrelease")
        if rel:
            return rel
        return os.uname().release if self.live else None

    def hostname(self) -> str | None:
        name = self.value("/proc/sys/kernel/hostname") or self.value("/etc/hostname")
        if name:
            return name
        return os.uname().nodename if self.live else None
