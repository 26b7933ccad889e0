"""Shared test helpers: start real kvd daemons on temporary sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wait_for_socket(path: str, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until a kvd daemon answers PING on ``path``."""
    from infera.kvd.client import KvdClient, KvdClientError

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"daemon exited with {proc.returncode} before serving:\n{out}")
        if os.path.exists(path):
            try:
                with KvdClient(path, want_arena=False, timeout=2.0) as c:
                    c.ping()
                return
            except KvdClientError as exc:
                last = exc
        time.sleep(0.02)
    raise TimeoutError(f"daemon on {path} not ready after {timeout}s: {last}")


class Daemon:
    """A real ``python -m infera.kvd`` process."""

    def __init__(self, sock: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.socket = sock
        self.args = args
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> Daemon:
        cmd = [sys.executable, "-m", "infera.kvd", "--socket", self.socket, *self.args]
        logf = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        logf.close()
        try:
            wait_for_socket(self.socket, timeout)
        except Exception:
            self.kill()
            raise RuntimeError(f"daemon failed to start; log:\n{self.log()}") from None
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 15.0) -> Daemon:
        self.stop()
        return self.start(timeout)

    def client(self, **kw: object):  # type: ignore[no-untyped-def]
        from infera.kvd.client import KvdClient

        return KvdClient(self.socket, **kw)  # type: ignore[arg-type]


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
