"""The client table of ``kvd top``: its columns and one row of cells per connected client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infera.display import printable
from infera.tui.model import format_count, format_duration, pin_state, sort_clients
from infera.units import format_size

CLIENT_COLUMNS = (
    "pid",
    "name",
    "role",
    "namespace",
    "model",
    "hash",
    "data path",
    "requests",
    "leases",
    "pinned",
    "up",
    "fallback reason",
)
RIGHT_ALIGNED = {CLIENT_COLUMNS.index(c) for c in ("pid", "requests", "leases", "pinned", "up")}
QUOTA_MARK = " !"  # after a pinned cell: some of the client's PUT keys were refused for its pin quota


def pinned_cell(client: Mapping[str, Any]) -> str:
    """What the client keeps from eviction, with its share of its pin quota when it has one
    (``1.5 GiB 38%``), marked when the quota refused some of its PUT keys; ``-`` from an older daemon."""
    state = pin_state(client)
    if state is None:
        return "-"
    pinned, share, refused = state
    text = format_size(pinned)
    if share is not None:
        text += f" {share:.0%}"
    return text + QUOTA_MARK if refused > 0 else text


def client_cells(client: Mapping[str, Any]) -> list[str]:
    """One row of the client table. A fallback row's last cell says why it fell back (last, so a
    long reason never pushes the other columns off screen). What clients declared about themselves
    has its control characters escaped: a newline in a name must not split the row."""
    path = str(client.get("data_path") or "arena")
    reason = ""
    if client.get("fallback"):
        path += " (fallback)"
        reason = str(client.get("fallback_reason") or "no reason given")
    cells = [
        str(client.get("pid", "")),
        str(client.get("name") or ""),
        str(client.get("role") or ""),
        str(client.get("namespace") or "-"),
        str(client.get("model") or ""),
        str(client.get("hash_fingerprint") or "")[:12],
        path,
        format_count(client.get("requests", 0)),
        format_count(client.get("leases", 0)),
        pinned_cell(client),
        format_duration(client.get("connected_s", 0)),
        reason,
    ]
    return [printable(cell) for cell in cells]


def client_rows(stats: Mapping[str, Any], sort: str) -> list[tuple[str, list[str], bool]]:
    """``(row key, cells, fell back)`` for every client, in the order of ``sort``."""
    clients = [c for c in _clients(stats) if isinstance(c, Mapping)]
    return [
        (str(c.get("id", c.get("pid"))), client_cells(c), bool(c.get("fallback")))
        for c in sort_clients(clients, sort)
    ]


def _clients(stats: Mapping[str, Any]) -> list[Any]:
    value = stats.get("clients")
    return value if isinstance(value, list) else []


__all__ = ["CLIENT_COLUMNS", "QUOTA_MARK", "RIGHT_ALIGNED", "client_cells", "client_rows", "pinned_cell"]
