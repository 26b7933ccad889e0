"""The fault-injection harness: hostile clients and the healthy client that must not notice them.

Every hostile test follows one shape::

    with HealthProbe(daemon.socket) as probe:   # a healthy engine doing put+get, checking bytes
        ...misbehave against the same daemon...  # raw sockets from :func:`raw`, floods, stalls
    probe.assert_healthy()                       # correct bytes, p99 under the deadline, no errors

``HealthProbe`` runs in a thread of the test process, with its own namespace, and records the
latency of every put+get round of a small chunk. The deadline is the one docs/daemon.md states in
"Guarantees and limits" (:data:`P99_DEADLINE_S`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any

from infera.kvd import protocol as P

P99_DEADLINE_S = 0.100  # a healthy client's put+get p99 while another client misbehaves
MAX_STALL_S = 0.5  # the longest any single healthy round may take


def frame(msg: dict[str, Any]) -> bytes:
    """One complete request frame."""
    return P.encode(msg)


def raw(path: str, timeout: float = 5.0) -> socket.socket:
    """A raw connection to the daemon, no HELLO: the hostile client's starting point."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def hello(s: socket.socket, rid: int = 1, **fields: Any) -> dict[str, Any]:
    """Send HELLO on a raw socket and read its reply (closing any passed descriptors)."""
    s.sendall(frame({"op": "HELLO", "id": rid, "versions": [P.PROTOCOL_VERSION], **fields}))
    return read_reply(s)


def read_reply(s: socket.socket) -> dict[str, Any]:
    """Read one reply frame from a raw socket; descriptors that came with it are closed."""
    head = b""
    fds: list[int] = []
    while len(head) < 4:
        data, got, _flags, _addr = socket.recv_fds(s, 4 - len(head), 8)
        fds += got
        if not data:
            raise ConnectionError("daemon closed the connection")
        head += data
    (n,) = P.HEADER.unpack(head)
    body = b""
    while len(body) < n:
        data = s.recv(n - len(body))
        if not data:
            raise ConnectionError("daemon closed the connection mid-frame")
        body += data
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    out = P.decode_body(body)
    assert isinstance(out, dict)
    return out


def daemon_rss(pid: int) -> int:
    """Resident set size of a process in bytes (from /proc)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class HealthProbe:
    """A healthy client doing put+get rounds of ``size``-byte chunks, verifying every byte."""

    def __init__(self, socket_path: str, size: int = 64 << 10, namespace: str = "healthy-probe") -> None:
        self.socket_path = socket_path
        self.size = size
        self.namespace = namespace
        self.latencies: list[float] = []
        self.wrong = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def __enter__(self) -> HealthProbe:
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"health probe could not connect: {self.errors}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        from infera.kvd.client import KvdClient

        try:
            client = KvdClient(self.socket_path, namespace=self.namespace, name="health-probe", timeout=10)
        except Exception as exc:  # reported by __enter__ / assert_healthy
            self.errors.append(f"connect: {exc}")
            self._ready.set()
            return
        self._ready.set()
        i = 0
        with client:
            while not self._stop.is_set():
                key = f"probe-{i % 64}".encode()
                payload = (i.to_bytes(8, "little") * (self.size // 8 + 1))[: self.size]
                t0 = time.monotonic()
                try:
                    client.put(key, payload, retention="short", overwrite=True)
                    got = client.get(key)
                except Exception as exc:
                    self.errors.append(f"round {i}: {type(exc).__name__}: {exc}")
                    break
                self.latencies.append(time.monotonic() - t0)
                if got != payload:
                    self.wrong += 1
                i += 1
                time.sleep(0.002)

    def p99(self) -> float:
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("inf")

    def assert_healthy(
        self, p99_s: float = P99_DEADLINE_S, max_s: float = MAX_STALL_S, min_rounds: int = 20
    ) -> None:
        self.stop()
        assert not self.errors, f"healthy client failed: {self.errors[:3]}"
        assert self.wrong == 0, f"healthy client read {self.wrong} wrong chunks"
        assert len(self.latencies) >= min_rounds, f"only {len(self.latencies)} healthy rounds completed"
        worst = max(self.latencies)
        assert self.p99() <= p99_s, f"healthy p99 {self.p99() * 1e3:.1f} ms > {p99_s * 1e3:.0f} ms"
        assert worst <= max_s, f"a healthy round took {worst * 1e3:.0f} ms (> {max_s * 1e3:.0f} ms)"


# -- hostile filesystems (disk long tier, L3) -------------------------------------------------
# Used by tests/tiers/test_disk_hostile.py. Imports stay inside the functions so this block is
# self-contained (others add blocks to this file too).


@contextlib.contextmanager
def tmpfs(mnt: str | os.PathLike[str], size: str = "2m") -> Any:
    """Mount a ``size`` tmpfs at ``mnt`` (created if missing; needs root) and always unmount it
    afterwards, lazily, so a daemon still holding files there cannot keep it mounted."""
    import subprocess

    import pytest

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
    import errno

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
    import stat

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
