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


# ---------------------------------------------------------------------------------------------
# Trust-boundary helpers (h16-arena): the arena descriptor of a raw HELLO, a fake daemon, and a
# daemon start that must be refused. Run as a script (``python tests/hostile.py fake-daemon
# OPTIONS_JSON``) this file is the fake daemon's process.
# ---------------------------------------------------------------------------------------------
import fcntl as _fcntl  # noqa: E402
import json as _json  # noqa: E402
import signal as _signal  # noqa: E402
import stat  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import sys as _sys  # noqa: E402
import tempfile  # noqa: E402


def client_process(code: str, *args: str, timeout: float = 120.0) -> str:
    """Run ``code`` (a Python script, dedented; ``sys.argv[1:]`` are ``args``) in a process of its
    own and return what it printed; an AssertionError with its stderr when it fails."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"the client process failed:\n{done.stderr[-3000:]}"
    return done.stdout


def hello_fds(s: socket.socket, rid: int = 1, **fields: Any) -> tuple[dict[str, Any], list[int]]:
    """Send HELLO on a raw socket; return its reply and the descriptors that came with it (the
    caller closes them): what a hostile client holds after HELLO."""
    s.sendall(frame({"op": "HELLO", "id": rid, "versions": [P.PROTOCOL_VERSION], **fields}))
    reader = P.FrameReader()
    fds: list[int] = []
    while True:
        data, got, _flags, _addr = socket.recv_fds(s, 1 << 16, 8)
        fds += got
        if not data:
            raise ConnectionError("daemon closed the connection")
        bodies = reader.feed(data)
        if bodies:
            out = P.decode_body(bodies[0])
            assert isinstance(out, dict)
            return out, fds


def refused_start(args: list[str], timeout: float = 20.0) -> str:
    """Run ``python -m infera.kvd ARGS``, which must refuse to start; returns its stderr.

    Asserts a non-zero exit, no traceback and exactly one ``error:`` line (plus at most its
    ``hint:`` line; log records are ignored). A daemon that starts serving instead is killed at
    once and fails the assertion, so a test of a refusal never waits for a timeout."""
    with tempfile.TemporaryFile("w+") as err:
        proc = _subprocess.Popen([_sys.executable, "-m", "infera.kvd", *args], stderr=err, stdout=err)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            err.seek(0)
            if " serving on " in err.read() or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                err.seek(0)
                raise AssertionError(f"daemon started instead of refusing:\n{err.read()}")
            time.sleep(0.05)
        err.seek(0)
        text = err.read()
    assert proc.returncode != 0, f"daemon exited {proc.returncode}: {text}"
    assert "Traceback" not in text, text
    lines = [ln for ln in text.splitlines() if ln.strip() and " INFO " not in ln]
    assert len([ln for ln in lines if ln.startswith("error: ")]) == 1, text
    assert all(ln.startswith(("error: ", "hint: ")) for ln in lines) and len(lines) <= 2, text
    return text


def sealed_memfd(size: int, seals: int | None = None) -> int:
    """A memfd of ``size`` bytes with ``seals`` added (default: the daemon's, size sealed)."""
    fd = os.memfd_create("fake-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals is None:
        seals = _fcntl.F_SEAL_SHRINK | _fcntl.F_SEAL_GROW | _fcntl.F_SEAL_SEAL
    if seals:
        _fcntl.fcntl(fd, _fcntl.F_ADD_SEALS, seals)
    return fd


class FakeDaemon:
    """A process pretending to be kvd on ``path``, recording every byte and op it receives.

    ``uid``: drop to this uid/gid before binding (the listener's SO_PEERCRED). ``arena``: what
    HELLO passes: ``sealed`` (like the daemon), ``unsealed``, ``short`` (sealed, half the announced
    size) or ``none``. ``backlog``: listen() backlog. ``hold_accept``: accept nothing until
    :meth:`release_accept` (SIGUSR1), so the accept queue can be filled. PUT gets real slots, so
    a client that trusts it writes its bytes into the fake's arena."""

    def __init__(
        self,
        path: str,
        *,
        uid: int | None = None,
        arena: str = "sealed",
        arena_size: int = 1 << 20,
        backlog: int = 16,
        hold_accept: bool = False,
    ) -> None:
        self.path = path
        self.opts = {
            "path": path,
            "uid": uid,
            "arena": arena,
            "arena_size": arena_size,
            "backlog": backlog,
            "hold_accept": hold_accept,
        }
        self.events: list[dict[str, Any]] = []
        self.proc: _subprocess.Popen[bytes] | None = None
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    def __enter__(self) -> FakeDaemon:
        self.proc = _subprocess.Popen(
            [_sys.executable, os.path.abspath(__file__), "fake-daemon", _json.dumps(self.opts)],
            stdout=_subprocess.PIPE,
        )
        self._reader = threading.Thread(target=self._read, name="fake-daemon-out", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 20
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fake daemon did not start (exit {self.proc.returncode})")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            event = _json.loads(line)
            self.events.append(event)
            if event.get("event") == "listening":
                self._listening.set()

    def release_accept(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(_signal.SIGUSR1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self._reader is not None:
            self._reader.join(10)
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)

    @property
    def ops(self) -> list[str]:
        return [str(e["op"]) for e in self.events if e.get("event") == "op"]

    @property
    def bytes_received(self) -> int:
        return sum(int(e["n"]) for e in self.events if e.get("event") == "bytes")


def _fake_daemon_main(opts: dict[str, Any]) -> None:
    out_lock = threading.Lock()

    def emit(**event: Any) -> None:
        with out_lock:
            _sys.stdout.write(_json.dumps(event) + "\n")
            _sys.stdout.flush()

    size = int(opts["arena_size"])
    kind = opts["arena"]
    arena_fd = -1
    if kind == "sealed":
        arena_fd = sealed_memfd(size)
    elif kind == "short":
        arena_fd = sealed_memfd(size // 2)
    elif kind == "unsealed":
        arena_fd = os.memfd_create("fake-arena", os.MFD_CLOEXEC)
        os.ftruncate(arena_fd, size)
    if opts["hold_accept"]:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, [_signal.SIGUSR1])
    if opts["uid"] is not None:
        os.setgroups([])
        os.setgid(int(opts["uid"]))
        os.setuid(int(opts["uid"]))
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(opts["path"])
    srv.listen(int(opts["backlog"]))
    emit(event="listening")
    if opts["hold_accept"]:
        _signal.sigwait([_signal.SIGUSR1])

    def serve(conn: socket.socket) -> None:
        reader = P.FrameReader()
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                emit(event="closed")
                return
            emit(event="bytes", n=len(data))
            for body in reader.feed(data):
                msg = P.decode_body(body)
                op = msg.get("op")
                emit(event="op", op=op)
                if msg.get("noreply"):
                    continue
                reply: dict[str, Any] = {"id": msg.get("id", 0), "ok": True}
                if op == "HELLO":
                    reply.update(
                        version=P.PROTOCOL_VERSION, server_version="fake", client_id=1, arena_size=size
                    )
                    reply["long_tier"] = None
                    fds = [arena_fd] if arena_fd >= 0 and msg.get("want_arena", True) else []
                    socket.send_fds(conn, [P.encode(reply)], fds)
                    continue
                if op == "PUT":  # every chunk at offset 0: the fake only needs to receive them
                    reply["slots"] = [[i + 1, 0] for i in range(len(msg.get("lengths", [])))]
                elif op == "PING":
                    reply["pong"] = True
                conn.sendall(P.encode(reply))

    while True:
        conn, _ = srv.accept()
        emit(event="accepted")
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


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


if __name__ == "__main__" and _sys.argv[1:2] == ["fake-daemon"]:
    _fake_daemon_main(_json.loads(_sys.argv[2]))
