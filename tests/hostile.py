"""The fault-injection harness: hostile clients and the healthy client that must not notice them.

Every hostile test follows one shape::

    with HealthProbe(daemon.socket) as probe:   # a healthy engine doing put+get, checking bytes
        ...misbehave against the same daemon...  # raw sockets from :func:`raw`, floods, stalls
    probe.assert_healthy()                       # correct bytes, p99 under the deadline, no errors

``HealthProbe`` runs in a thread of the test process, with its own namespace, and records the
latency of every put+get round of a small chunk. A misbehaving client that is busy in Python
itself (building and decoding big batches) runs in a process of its own (:func:`client_process`),
as another engine would, so the probe measures the daemon, not this process's interpreter lock. The deadline is the one docs/daemon.md states in
"Guarantees and limits" (:data:`P99_DEADLINE_S`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any

from infera.kvd import protocol as P
from infera.kvd.process import wait_until

if TYPE_CHECKING:
    from infera.kvd.client import KvdClient

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
    return read_reply_fds(s)[0]


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

    def _connect(self, name: str) -> KvdClient | None:
        """The probe's client; ``None`` (the error recorded and ``__enter__`` released) when the
        daemon cannot be reached."""
        from infera.kvd.client import KvdClient

        try:
            return KvdClient(self.socket_path, namespace=self.namespace, name=name, timeout=10)
        except Exception as exc:  # reported by __enter__ / assert_healthy
            self.errors.append(f"connect: {exc}")
            self._ready.set()
            return None

    def _run(self) -> None:
        client = self._connect("health-probe")
        if client is None:
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


def client_process(code: str, *args: str, timeout: float = 120.0) -> str:
    """Run ``code`` (a Python script, dedented; ``sys.argv[1:]`` are ``args``) in a process of its
    own and return what it printed; an AssertionError with its stderr when it fails."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"the client process failed:\n{done.stderr[-3000:]}"
    return done.stdout


# --- h16-store: a probe for a full arena ------------------------------------------------------


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
        keys = [f"held-{i}".encode() for i in range(self.nkeys)]
        payloads = [(i.to_bytes(8, "little") * (self.size // 8 + 1))[: self.size] for i in range(len(keys))]
        client = self._connect("holding-probe")
        if client is None:
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


# -- loop hardening (h16-loop): bulk frame I/O, descriptor-carrying replies (process meters:
# infera.bench.procfs) -----------------------------------------------------------------------


def read_reply_fds(s: socket.socket) -> tuple[dict[str, Any], int]:
    """Read one reply frame from a raw socket; return it and how many descriptors came with it
    (they are closed)."""
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
    return out, len(fds)


def read_replies(s: socket.socket, count: int, timeout: float = 10.0, decode: bool = True) -> list[Any]:
    """Read ``count`` reply frames in bulk (descriptors are not expected); bodies are decoded
    unless ``decode`` is false (then each entry is the raw body, e.g. to decode it later, when a
    probe in this process no longer waits for the interpreter lock)."""
    reader = P.FrameReader()
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"got {len(out)} of {count} replies in {timeout}s")
        s.settimeout(left)
        data = s.recv(1 << 20)
        if not data:
            raise ConnectionError(f"daemon closed the connection after {len(out)} of {count} replies")
        for body in reader.feed(data):
            out.append(P.decode_body(body) if decode else body)
    return out


def pipeline(s: socket.socket, data: bytes, stall_s: float = 1.0) -> int:
    """Send ``data`` without reading anything back, until it is all gone or the daemon has taken
    nothing for ``stall_s``; returns how many bytes went."""
    view = memoryview(data)
    sent = 0
    s.settimeout(stall_s)
    try:
        while sent < len(data):
            sent += s.send(view[sent : sent + (1 << 20)])
    except (TimeoutError, BlockingIOError):
        pass
    except OSError:  # the daemon hung up on us
        pass
    return sent


def enough_rounds(probe: HealthProbe, rounds: int = 40, timeout: float = 30.0) -> None:
    """Let the healthy client run long enough for its p99 to mean something: ``rounds`` rounds
    (or an error of its own); a KvdError after ``timeout`` seconds."""
    wait_until(lambda: len(probe.latencies) >= rounds or probe.errors, timeout, f"{rounds} healthy rounds")


def wait_rounds(probe: HealthProbe, rounds: int = 50, timeout: float = 10.0) -> None:
    """Keep the probe going until it has done ``rounds`` put+get rounds (a quick misbehaviour
    otherwise leaves too few rounds for a p99)."""
    deadline = time.monotonic() + timeout
    while len(probe.latencies) < rounds and not probe.errors and time.monotonic() < deadline:
        time.sleep(0.01)
