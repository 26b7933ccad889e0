"""``DaemonProcess``: start a ``python -m infera.kvd`` child process and wait until it serves.

The one harness the demo, the benchmarks and the tests use to run a real daemon: spawn it with its
output in a log file, poll PING on its socket until it answers (an early exit or a timeout is a
:class:`~infera.errors.KvdError` carrying the end of the log), and stop it with SIGTERM, then
SIGKILL after a timeout. :func:`temp_daemon` runs one on a throwaway socket for a ``with`` block.

:func:`wait_until` polls for anything else a caller waits on (the benchmarks and the tests wait on
a daemon's stats with it); :func:`stop_child` and :func:`kill_child` stop any child process the
way :class:`DaemonProcess` stops its daemon (the services of :mod:`infera.bench.services` too).

A client-side tool: it talks to the daemon only through :class:`~infera.kvd.client.KvdClient` and
never imports the daemon's own modules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from infera.errors import KvdError
from infera.kvd.client import KvdClient, KvdClientError

POLL_S = 0.02  # between two PING attempts while the daemon starts
TAIL_CHARS = 4000  # of the log, in the error of a daemon that did not come up

T = TypeVar("T")


def wait_until(pred: Callable[[], T], timeout: float, what: str, poll_s: float = POLL_S) -> T:
    """Call ``pred`` every ``poll_s`` seconds until it returns something true (say, a daemon's
    stats once they show what a caller waits for), and return that; after ``timeout`` seconds a
    KvdError ``timed out waiting for WHAT``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise KvdError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM a child process, then SIGKILL after ``timeout`` seconds; reap it and return its exit
    status (an exited one's status at once)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_child(proc)
    return proc.returncode


def kill_child(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a child process that still runs, and reap it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL every process left in the group ``proc`` led (started with ``start_new_session``),
    also once ``proc`` itself has exited: a child that skipped its teardown (``os._exit``) can
    leave helpers behind (vLLM's multiprocessing resource tracker) that hold its pipes open."""
    kill_child(proc)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen[Any], timeout: float = 60.0) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session``), wait up to
    ``timeout`` seconds, then SIGKILL it; reaped either way."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class DaemonProcess:
    """One ``python -m infera.kvd --socket SOCKET [--log-level LEVEL] ARGS...`` child process.

    ``socket``: the socket path; ``None`` makes a private temporary directory under /tmp holding
    the socket and the log, removed by :meth:`close` (and at the end of a ``with`` block).
    ``log_path``: where the daemon's stdout and stderr go (appended to, across restarts); by
    default ``daemon.log`` in the temporary directory, else ``SOCKET.log``. ``env``: variables
    set over this process's environment. ``python``: the interpreter to run (another venv's, on a
    GPU host). ``command``: the whole argv before ``--socket`` instead of ``PYTHON -m infera.kvd``
    (e.g. ``kvd serve``). ``label``: how errors name the daemon.

    :meth:`start`, :meth:`stop`, :meth:`restart` and :meth:`kill` may be called in any order and
    repeatedly; ``args`` is read at each start, so a test may change it between two starts.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        log_level: str | None = None,
        command: Sequence[str] | None = None,
        label: str = "the kvd daemon",
        tmp_prefix: str = "kvd-",
    ) -> None:
        self._tmpdir: str | None = None
        if socket is None:
            self._tmpdir = tempfile.mkdtemp(prefix=tmp_prefix, dir="/tmp")
            socket = os.path.join(self._tmpdir, "kvd.sock")
            if log_path is None:
                log_path = os.path.join(self._tmpdir, "daemon.log")
        self.socket = os.fspath(socket)
        self.args = list(args)
        self.log_path = Path(log_path if log_path is not None else self.socket + ".log")
        self.env = dict(env) if env is not None else None
        self.python = python or sys.executable
        self.log_level = log_level
        self.command = list(command) if command is not None else None
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None

    # -- the command ---------------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        """What :meth:`start` runs."""
        cmd = self.command if self.command is not None else [self.python, "-m", "infera.kvd"]
        level = ["--log-level", self.log_level] if self.log_level else []
        return [*cmd, "--socket", self.socket, *level, *self.args]

    # -- life cycle ----------------------------------------------------------------------------
    def spawn(self) -> DaemonProcess:
        """Start the process and return at once, without waiting for it to serve."""
        if self.alive():
            raise KvdError(f"{self.label} is already running (pid {self.pid})")
        env = {**os.environ, **self.env} if self.env is not None else None
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def wait_ready(self, timeout: float = 20.0) -> DaemonProcess:
        """Poll PING until the daemon answers; an exit or ``timeout`` seconds is a KvdError.

        A daemon that did not answer in time is killed before the error is raised."""
        if self.proc is None:
            raise KvdError(f"{self.label} was never started")
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise KvdError(
                    f"{self.label} exited with status {rc} before serving on {self.socket}; "
                    f"the end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            if os.path.exists(self.socket):
                try:
                    with KvdClient(self.socket, want_arena=False, timeout=2.0) as c:
                        c.ping()
                    return self
                except KvdClientError as exc:
                    last = exc
            if time.monotonic() > deadline:
                self.kill()
                raise KvdError(
                    f"{self.label} did not answer PING on {self.socket} within {timeout:g} s "
                    f"({last or 'no socket'}); the end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(POLL_S)

    def start(self, timeout: float = 20.0) -> DaemonProcess:
        """Spawn the daemon and wait until it answers PING (see :meth:`wait_ready`)."""
        return self.spawn().wait_ready(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit status (``None``: never
        started). Stopping a stopped daemon only returns its status again."""
        return None if self.proc is None else stop_child(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL (a crash, as far as the daemon's state on disk goes) and reap it."""
        if self.proc is not None:
            kill_child(self.proc)

    def restart(self, timeout: float = 20.0, stop_timeout: float = 10.0) -> DaemonProcess:
        """:meth:`stop`, then :meth:`start` again on the same socket and arguments."""
        self.stop(stop_timeout)
        return self.start(timeout)

    def close(self) -> None:
        """Stop the daemon and remove the temporary directory this object made, if any."""
        self.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> DaemonProcess:
        return self if self.alive() else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        """The pid of the latest process started (it may have exited since)."""
        if self.proc is None:
            raise KvdError(f"{self.label} was never started")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def log(self) -> str:
        """Everything the daemon wrote so far (all starts), or ``""``."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = TAIL_CHARS) -> str:
        """The end of :meth:`log`, cut at a line start."""
        text = self.log().rstrip()
        if len(text) <= chars:
            return text
        tail = text[-chars:]
        return tail.split("\n", 1)[1] if "\n" in tail else tail

    def client(self, **kw: Any) -> KvdClient:
        """A :class:`KvdClient` on this daemon's socket (keyword arguments passed through)."""
        return KvdClient(self.socket, **kw)

    def stats(self) -> dict[str, Any]:
        """The daemon's STATS snapshot, over a connection of its own (no arena)."""
        with self.client(want_arena=False) as c:
            return dict(c.stats())

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.alive() and self.proc else "stopped"
        return f"DaemonProcess({self.socket!r}, {state})"


@contextlib.contextmanager
def temp_daemon(
    *args: str,
    timeout: float = 20.0,
    log_level: str | None = "warning",
    label: str = "the benchmark daemon",
    **kw: Any,
) -> Iterator[tuple[str, DaemonProcess]]:
    """Run a daemon on a temporary socket for the duration of the block; yields (socket, daemon).

    ``args`` are the daemon's flags; other keywords go to :class:`DaemonProcess`."""
    kw.setdefault("tmp_prefix", "kvd-bench-")
    daemon = DaemonProcess(None, args, log_level=log_level, label=label, **kw)
    try:
        daemon.start(timeout)
        yield daemon.socket, daemon
    finally:
        daemon.close()
