"""The kvd daemon as the doctor sees it: one STATS call, made once per run."""

from __future__ import annotations

import os
from dataclasses import dataclass
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
