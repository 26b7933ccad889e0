"""External services on loopback, for the benchmarks and the tests: Mooncake master and storage
node, lmcache_server, etcd and Redis.

Each service runs as a child process on free ports, with its output in a log file, a readiness
wait (a TCP connect, or the service's own health answer), and teardown by PID (SIGTERM, then
SIGKILL, as :mod:`infera.kvd.process` stops a daemon). A program that is not installed raises
:class:`ServiceMissing` (the tests turn that into a skip with :func:`set_missing_handler`); every
other failure at start is a RuntimeError that shows the service's log.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from infera.errors import KvdError
from infera.kvd.process import kill_child, stop_child

REPO = Path(__file__).resolve().parent.parent.parent
VENV_BIN = Path(sys.executable).parent
# Seconds a Mooncake client may go without a heartbeat (one a second) before the master drops it
# and unmounts its segment, losing every key on it. Mooncake's default is 10 s; on a busy 2-core
# host a storage node, or a master resumed after a pause, can miss that (CI lost a run's keys so).
CLIENT_TTL_S = 30


class ServiceMissing(KvdError):
    """A program a service needs is not installed."""


def _raise_missing(message: str) -> NoReturn:
    raise ServiceMissing(message, hint="scripts/setup.sh --all installs every service")


_on_missing: Callable[[str], NoReturn] = _raise_missing


def set_missing_handler(handler: Callable[[str], NoReturn]) -> None:
    """What :func:`require` does when a program is missing (the tests: ``pytest.skip``)."""
    global _on_missing
    _on_missing = handler


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def find_program(name: str, *candidates: Path, env: str | None = None) -> str | None:
    """``$env`` if set, else the first existing candidate, else the test venv's bin, else PATH."""
    if env and os.environ.get(env):
        return os.environ[env]
    for c in (*candidates, VENV_BIN / name):
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which(name)


def require(name: str, *candidates: Path, env: str | None = None, hint: str = "") -> str:
    path = find_program(name, *candidates, env=env)
    if path is None:
        _on_missing(f"{name} is not installed{': ' + hint if hint else ''}")
    return path


class Service:
    """One child process. ``ready()`` says when it serves; ``start``/``stop``/``kill``/``restart``."""

    def __init__(self, name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.workdir = workdir
        self.env = {**os.environ, **(env or {})}
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Service:
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.argv, stdout=logf, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir
            )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} at start:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log()}")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            stop_child(self.proc, timeout)

    def kill(self) -> None:
        if self.proc is not None:
            kill_child(self.proc)

    def restart(self, timeout: float = 30.0) -> Service:
        self.stop()
        return self.start(timeout)


MASTER_GAUGES = {  # mooncake_master's metrics that explain a refused put
    "master_total_capacity_bytes": "capacity bytes",
    "master_allocated_bytes": "allocated bytes",
    "master_key_count": "keys",
    "master_active_clients": "active clients",
    "master_put_start_alloc_failures_total": "failed allocations",
    "master_unmount_segment_requests_total": "unmounts",
}


class MooncakeMaster(Service):
    """``mooncake_master`` with its HTTP metadata server, on free loopback ports."""

    def __init__(self, workdir: Path, lease_ms: int = 500, client_ttl_s: int = CLIENT_TTL_S) -> None:
        self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        exe = require("mooncake_master", hint="pip install 'infera-kvd[mooncake]' (scripts/setup.sh --all)")
        argv = [
            exe,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={self.rpc_port}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={self.metrics_port}",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http_port}",
            f"--default_kv_lease_ttl={lease_ms}",
            f"--client_ttl={client_ttl_s}",
        ]
        super().__init__("mooncake_master", argv, workdir)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    def describe(self) -> str:
        """One line on the pool, for an error message: capacity, use, clients, failed allocations
        and clients the master declared expired (their segments were unmounted)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                text = r.read().decode(errors="replace")
        except OSError as exc:
            return f"mooncake_master's metrics did not answer: {exc}"
        values = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in MASTER_GAUGES:
                values[MASTER_GAUGES[name]] = value.strip()
        expired = self.log(tail=1 << 20).count("action=client_expired")
        return ", ".join(f"{k} {v}" for k, v in values.items()) + f", clients expired {expired}"

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def ready(self) -> bool:
        return tcp_open("127.0.0.1", self.rpc_port) and tcp_open("127.0.0.1", self.http_port)


class MooncakeStorageNode(Service):
    """``mooncake_client``: a long-lived process that lends ``segment`` bytes to the pool."""

    def __init__(
        self, workdir: Path, master: MooncakeMaster, segment: str = "128 MB", metadata: str | None = None
    ) -> None:
        self.port = free_port()
        self.master = master
        self.metadata = metadata or master.metadata
        exe = require("mooncake_client", hint="pip install 'infera-kvd[mooncake]'")
        argv = [
            exe,
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--global_segment_size={segment}",
            "--local_buffer_size=16 MB",
            f"--master_server_address={master.address}",
            f"--metadata_server={self.metadata}",
            "--protocol=tcp",
        ]
        super().__init__("mooncake_client", argv, workdir, env={"MC_TCP_BIND_ADDRESS": "127.0.0.1"})

    def ready(self) -> bool:
        # it listens once its segment is mounted with the master
        return tcp_open("127.0.0.1", self.port)


@contextlib.contextmanager
def running(*svcs: Service) -> Iterator[None]:
    """Start ``svcs`` in order; stop the started ones in reverse order on the way out."""
    started: list[Service] = []
    try:
        for svc in svcs:
            started.append(svc)
            svc.start()
        yield
    finally:
        for svc in reversed(started):
            svc.stop()


@contextlib.contextmanager
def mooncake_cluster(workdir: Path, segment: str) -> Iterator[MooncakeMaster]:
    """A throwaway Mooncake Store for a benchmark: a master and one storage node lending
    ``segment``."""
    master = MooncakeMaster(workdir)
    node = MooncakeStorageNode(workdir, master, segment=segment)
    try:
        stack = contextlib.ExitStack()
        stack.enter_context(running(master, node))
    except RuntimeError as exc:  # one line for the user, not the log dump
        first, *log = str(exc).strip().splitlines()
        said = [line for line in log if re.match(r"[EF]\d{4} ", line)] or log  # glog's errors first
        raise KvdError(
            first.rstrip(":"), hint=f"its log says: {said[-1].strip()}" if said else None
        ) from None
    with stack:
        yield master


class LMCacheServer(Service):
    """``lmcache_server HOST PORT`` (from .venv-lmcache, which scripts/setup.sh --all creates)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        exe = require(
            "lmcache_server",
            REPO / ".venv-lmcache" / "bin" / "lmcache_server",
            REPO / ".venv-bench" / "bin" / "lmcache_server",
            env="INFERA_TEST_LMCACHE_SERVER",
            hint="scripts/setup.sh --all creates .venv-lmcache with it",
        )
        env = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "LMCACHE_DISABLE_BANNER": "1"}
        super().__init__("lmcache_server", [exe, "127.0.0.1", str(self.port)], workdir, env=env)

    @property
    def url(self) -> str:
        return f"lm://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        return tcp_open("127.0.0.1", self.port)


class Etcd(Service):
    """A one-member etcd on loopback: free ports and the ``etcd`` on PATH unless ``port`` and
    ``exe`` are given (``benchmarks/pd.py --etcd-binary`` on a machine without the package)."""

    def __init__(self, workdir: Path, exe: str | None = None, port: int | None = None) -> None:
        self.port, self.peer_port = port or free_port(), free_port()
        exe = exe or require("etcd", hint="apt-get install etcd-server (scripts/setup.sh --all)")
        data = workdir / "etcd-data"
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        argv = [
            exe,
            "--name=kvd-test",
            f"--data-dir={data}",
            "--logger=zap",
            "--log-level=error",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kvd-test={peer}",
        ]
        super().__init__("etcd", argv, workdir)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as r:
                return b'"true"' in r.read()
        except OSError:
            return False


class Redis(Service):
    """``redis-server`` without persistence settings; a ``SAVE`` command still writes
    ``dump.rdb`` into ``workdir``, which a restart loads."""

    def __init__(self, workdir: Path, maxmemory: str = "256mb") -> None:
        self.port = free_port()
        exe = require("redis-server", hint="apt-get install redis-server (scripts/setup.sh --all)")
        argv = [
            exe,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            maxmemory,
            "--maxmemory-policy",
            "allkeys-lru",
        ]
        super().__init__("redis", argv, workdir)

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


__all__ = [
    "REPO",
    "Etcd",
    "LMCacheServer",
    "MooncakeMaster",
    "MooncakeStorageNode",
    "Redis",
    "Service",
    "ServiceMissing",
    "find_program",
    "free_port",
    "mooncake_cluster",
    "require",
    "running",
    "set_missing_handler",
    "tcp_open",
]
