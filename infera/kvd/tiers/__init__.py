"""Long tiers behind the RAM arena: local disk (L3) or a distributed store (L4).

A long tier offers the server: ``contains(ikey)``, ``promote(ikey) -> Chunk | None``,
``prewarm(ikeys) -> int``, ``delete(ikeys) -> int``, ``count_get(n, hits)``, ``stats() -> dict``,
``loading`` (bool), ``tick()`` and ``close()``; it hooks the store's seal/drop callbacks itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infera.errors import UsageError

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.server import Server

SUPPORTED: tuple[str, ...] = ()


def open_long_tier(cfg: DaemonConfig, server: Server) -> Any:
    raise UsageError(f"the {cfg.long_backend!r} long tier is not available in this build")
