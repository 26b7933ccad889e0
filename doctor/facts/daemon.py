"""The kvd daemon as the doctor sees it: one STATS call, made once per run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from infera.doctor.context import Context


@dataclass
class DaemonView:
    socket: str | None
    explicit: bool
    stats: dict[str, Any] | None
    error: str | None
    hint: str | None = None

    @property
    def reachable(self) -> bool:
        return self.stats is not None

    @property
    def absent(self) -> bool:
        """No socket was named and none exists at the default path: nothing to check, not a problem."""
        return not self.explicit and self.stats is None and not (self.socket and os.path.exists(self.socket))


def daemon(ctx: Context) -> DaemonView:
    return ctx.memo("daemon", _daemon)


def _daemon(ctx: Context) -> DaemonView:
    from infera.kvd.client import KvdClient, KvdClientError
    from infera.kvd.protocol import default_socket_path

    opts = ctx.options
    sock = opts.socket
    if not sock:
        if not ctx.live:
            return DaemonView(None, False, None, "no --socket given (and --root is not this machine)")
        sock = default_socket_path()
    try:
        with KvdClient(sock, want_arena=False, role="tool", name="kvd-doctor", timeout=3.0) as client:
            stats = client.stats()
    except KvdClientError as exc:
        return DaemonView(sock, opts.socket_explicit, None, exc.message, exc.hint)
    except OSError as exc:
        return DaemonView(sock, opts.socket_explicit, None, exc.strerror or str(exc))
    return DaemonView(sock, opts.socket_explicit, stats, None)


def engine_clients(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Clients that are engines (not tools such as stat, top or doctor)."""
    return [c for c in stats.get("clients", []) if c.get("role") not in ("tool", "stat", "top", "doctor")]


def client_label(c: dict[str, Any]) -> str:
    name = c.get("name") or "client"
    role = c.get("role") or "?"
    return f"{name} pid {c.get('pid')} ({role})"


SCHEDULER_ROLE = "vllm-scheduler"
WORKER_ROLE = "vllm-worker"  # + "-<rank>"


def client_name(c: dict[str, Any]) -> str:
    """``vllm:tiny pid 4242``: a client without its role (the halves of one engine share it)."""
    return f"{c.get('name') or 'client'} pid {c.get('pid')}"


@dataclass
class ClientEngine:
    """The daemon clients of one engine: its scheduler half and its workers' halves.

    vLLM runs both halves of a one-process engine (an ``LLM(...)`` script, the CPU backend) in one
    process; the workers of a multi-process engine connect from processes of their own."""

    clients: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pid(self) -> Any:
        return self.clients[0].get("pid")

    @property
    def pids(self) -> set[Any]:
        return {c.get("pid") for c in self.clients}

    @property
    def label(self) -> str:
        return client_name(self.clients[0])

    @property
    def namespace(self) -> Any:
        return self.clients[0].get("namespace")

    def has_role(self, prefix: str) -> bool:
        return any(str(c.get("role") or "").startswith(prefix) for c in self.clients)

    @property
    def workers_only(self) -> bool:
        return all(str(c.get("role") or "").startswith(WORKER_ROLE) for c in self.clients)


def client_engines(clients: list[dict[str, Any]]) -> list[ClientEngine]:
    """Engine clients by engine: one per process and client name, and a process of workers only
    joins an engine of its namespace that has a scheduler (a multi-process engine's workers)."""
    by_process: dict[tuple[Any, Any], ClientEngine] = {}
    for c in clients:
        by_process.setdefault((c.get("pid"), c.get("name")), ClientEngine()).clients.append(c)
    out = [e for e in by_process.values() if not e.workers_only]
    for workers in (e for e in by_process.values() if e.workers_only):
        home = next((e for e in out if e.has_role(SCHEDULER_ROLE) and e.namespace == workers.namespace), None)
        if home is None:
            out.append(workers)
        else:
            home.clients.extend(workers.clients)
    return out
