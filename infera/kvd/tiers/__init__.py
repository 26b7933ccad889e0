"""Long tiers behind the RAM arena: local disk (L3) or a distributed store (L4).

The long tier is disk *or* distributed, never both. A long tier object offers the server:

* ``contains(ikey) -> bool`` and ``promote(ikey) -> Chunk | None`` (a RAM miss that the long tier
  can serve is copied into the arena and returned sealed);
* optionally ``fetch(ikeys, on_ready) -> bool``: start reading the RAM misses of a GET in the
  background; when it returns True, GET defers its reply and ``on_ready()`` (called on the loop
  thread once every read has finished) answers it through ``Server.resume``; the tier keeps the
  request's chunks in RAM until then;
* ``prewarm(ikeys) -> int`` (background promotion, answers at once), ``delete(ikeys) -> int``;
* ``count_get(n, hits)``, ``stats() -> dict`` (the ``tiers.long`` section of STATS),
  ``loading`` (True while the index is still being rebuilt), ``tick()`` (once a second on the
  loop thread) and ``close()``.

It installs the store's ``on_seal`` / ``on_drop`` hooks itself to see chunks arrive and leave.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from infera.errors import UsageError

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.server import Server

# backend name -> (module, class); a backend whose module is missing is not offered.
BACKENDS = {
    "disk": ("infera.kvd.tiers.disk", "DiskTier"),
    "mooncake": ("infera.kvd.tiers.mooncake", "MooncakeTier"),
    "lmcache": ("infera.kvd.tiers.lmcache", "LMCacheTier"),
}


def _available() -> tuple[str, ...]:
    names = []
    for name, (mod, _cls) in BACKENDS.items():
        if importlib.util.find_spec(mod) is not None:
            names.append(name)
    return tuple(names)


SUPPORTED: tuple[str, ...] = _available()


def open_long_tier(cfg: DaemonConfig, server: Server) -> Any:
    backend = cfg.long_backend
    if backend not in BACKENDS:
        raise UsageError(f"unknown long tier backend {backend!r}")
    mod, cls = BACKENDS[backend]
    try:
        module = importlib.import_module(mod)
    except ImportError as exc:
        raise UsageError(f"the {backend!r} long tier is not available in this build ({exc})") from None
    return getattr(module, cls)(cfg, server)
