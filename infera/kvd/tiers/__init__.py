"""Long tiers behind the RAM arena: local disk (L3) or a distributed store (L4).

The long tier is disk *or* distributed, never both. The server opens it with
:func:`open_long_tier` and uses it through :class:`~.base.LongTier` only:

* GET: RAM misses go to ``fetch(ikeys, on_ready)``, which starts reading the ones the tier holds
  in the background. When it returns True, GET defers its reply; ``on_ready()`` (on the loop
  thread, once every read has finished or the tier's deadline passed) answers it through
  ``Server.resume``, and the chunks of that GET already in RAM stay pinned until then. The
  resumed GET finds the promoted chunks in RAM like any other; the keys found nowhere are
  counted by the GET itself (``count_misses``). The loop never waits for the tier.
* LOOKUP: ``contains_many(ikeys)`` (the distributed tier asks its store once for all of them) and
  ``loading`` (True while the index is rebuilt or the store was never reached).
* PREWARM: ``prewarm(ikeys) -> int`` (background reads, answers at once); DELETE:
  ``delete(ikeys) -> int``; ADOPT: ``adopt`` / ``write_through`` of a
  :class:`~.base.FileBackedTier` (the disk tier).
* ``stats()`` (the ``tiers.long`` section of STATS), ``tick()`` (once a second on the loop
  thread) and ``close()``.

A tier sees chunks arrive and leave through the store's ``on_seal`` / ``on_drop`` hooks, which
its write-through pipeline installs (:mod:`.pipeline`). :mod:`.base` says how a tier is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from infera.errors import UsageError

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.tiers.base import LongTier, TierHost

# backend name -> (module, class)
BACKENDS = {
    "disk": ("infera.kvd.tiers.disk", "DiskTier"),
    "mooncake": ("infera.kvd.tiers.mooncake", "MooncakeTier"),
    "lmcache": ("infera.kvd.tiers.lmcache", "LMCacheTier"),
}


def open_long_tier(cfg: DaemonConfig, host: TierHost) -> LongTier:
    backend = cfg.long_backend
    if backend not in BACKENDS:
        raise UsageError(f"unknown long tier backend {backend!r}")
    mod, cls = BACKENDS[backend]
    try:
        module = importlib.import_module(mod)
    except ImportError as exc:
        raise UsageError(f"the {backend!r} long tier is not available in this build ({exc})") from None
    tier: LongTier = getattr(module, cls)(cfg, host)
    return tier
