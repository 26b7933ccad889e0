"""Trust-boundary helpers (h16-arena): the descriptors a raw HELLO brings, a daemon start that must
be refused, and a fake daemon that records what a client sends it.

Run as a script (``python tests/fake_daemon.py fake-daemon OPTIONS_JSON``) this file is the fake
daemon's process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from hostile import frame

from infera.kvd import protocol as P


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
        proc = subprocess.Popen([sys.executable, "-m", "infera.kvd", *args], stderr=err, stdout=err)
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
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
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
        self.proc: subprocess.Popen[bytes] | None = None
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    def __enter__(self) -> FakeDaemon:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "fake-daemon", json.dumps(self.opts)],
            stdout=subprocess.PIPE,
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
            event = json.loads(line)
            self.events.append(event)
            if event.get("event") == "listening":
                self._listening.set()

    def release_accept(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)

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
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

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
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    if opts["uid"] is not None:
        os.setgroups([])
        os.setgid(int(opts["uid"]))
        os.setuid(int(opts["uid"]))
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(opts["path"])
    srv.listen(int(opts["backlog"]))
    emit(event="listening")
    if opts["hold_accept"]:
        signal.sigwait([signal.SIGUSR1])

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


if __name__ == "__main__" and sys.argv[1:2] == ["fake-daemon"]:
    _fake_daemon_main(json.loads(sys.argv[2]))
