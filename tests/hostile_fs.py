"""Hostile filesystems for the disk long tier (L3): a tiny tmpfs, a filesystem filled to ENOSPC,
and a snapshot of a tree to assert that nothing outside a daemon's directory changed."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from typing import Any

import pytest


@contextlib.contextmanager
def tmpfs(mnt: str | os.PathLike[str], size: str = "2m") -> Any:
    """Mount a ``size`` tmpfs at ``mnt`` (created if missing; needs root) and always unmount it
    afterwards, lazily, so a daemon still holding files there cannot keep it mounted."""
    path = os.fspath(mnt)
    os.makedirs(path, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs: {res.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill_up(directory: str | os.PathLike[str], name: str = "filler") -> str:
    """Fill the filesystem of ``directory`` with one file until ENOSPC; returns its path (delete
    it to give the space back)."""
    path = os.path.join(os.fspath(directory), name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for block in (1 << 16, 1 << 12):
            buf = b"\xa5" * block
            while True:
                try:
                    if os.write(fd, buf) < block:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return path


def tree_snapshot(root: str | os.PathLike[str]) -> dict[str, tuple[str, bytes]]:
    """Every entry under ``root``, symlinks not followed: relative path -> (kind, content or
    link target). For asserting that nothing outside a daemon's directory changed."""
    out: dict[str, tuple[str, bytes]] = {}
    base = os.fspath(root)
    for dirpath, dirs, files in os.walk(base):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                kind, body = "link", os.readlink(p).encode()
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    kind, body = "file", fh.read()
            else:
                kind, body = ("dir" if stat.S_ISDIR(st.st_mode) else "other"), b""
            out[os.path.relpath(p, base)] = (kind, body)
    return out
