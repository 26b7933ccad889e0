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


# --- h16-store: a probe for a full arena, and the daemon's thread count ------------------------


class HoldingProbe(HealthProbe):
    """A healthy engine on an arena someone else filled: it cannot count on room for new chunks,
    so it stores ``keys`` chunks once, holds them (LOOKUP ``hold_ms``, as an engine does before
    it reads), and then each round renews the hold and GETs one of them, checking every byte.
    The round's latency is what :meth:`assert_healthy` judges."""

    def __init__(
        self,
        socket_path: str,
        size: int = 64 << 10,
        namespace: str = "healthy-probe",
        keys: int = 8,
        hold_ms: int = 60_000,
    ) -> None:
        super().__init__(socket_path, size=size, namespace=namespace)
        self.nkeys = keys
        self.hold_ms = hold_ms

    def _run(self) -> None:
        from infera.kvd.client import KvdClient

        keys = [f"held-{i}".encode() for i in range(self.nkeys)]
        payloads = [(i.to_bytes(8, "little") * (self.size // 8 + 1))[: self.size] for i in range(len(keys))]
        try:
            client = KvdClient(self.socket_path, namespace=self.namespace, name="holding-probe", timeout=10)
        except Exception as exc:  # reported by __enter__ / assert_healthy
            self.errors.append(f"connect: {exc}")
            self._ready.set()
            return
        try:
            client.put_many(list(zip(keys, payloads, strict=True)), retention="short", overwrite=True)
            if client.lookup(keys, hold_ms=self.hold_ms) != len(keys):
                raise RuntimeError("the probe's own chunks are not all there")
        except Exception as exc:
            self.errors.append(f"setup: {type(exc).__name__}: {exc}")
            client.close()
            self._ready.set()
            return
        self._ready.set()
        i = 0
        with client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    held = client.lookup(keys, hold_ms=self.hold_ms)
                    got = client.get(keys[i % len(keys)])
                except Exception as exc:
                    self.errors.append(f"round {i}: {type(exc).__name__}: {exc}")
                    break
                self.latencies.append(time.monotonic() - t0)
                if held != len(keys) or got != payloads[i % len(keys)]:
                    self.wrong += 1
                i += 1
                time.sleep(0.002)


def daemon_threads(pid: int) -> int:
    """Number of threads of a process (from /proc)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0
