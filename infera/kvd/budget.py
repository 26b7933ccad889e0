"""How much of the arena one connection may keep from eviction: its pin budget (``--client-quota``).

A connection pins arena bytes two ways, and nothing can evict them while it does:

* its reservations, from PUT until it seals or aborts them;
* the chunks it leases, from GET until it releases them (a chunk leased several times at once
  counts once: it occupies its bytes once).

A PUT key that would take the sum past the connection's limit gets the per-key error ``quota``
instead of a slot (``put_rejected_quota_total``; the daemon says it once in its log). So a client
that reserves without sealing stops at its own limit, and the rest of the arena stays open to
the others. A connection that pins nothing may still reserve one chunk of any size the arena
holds, so the quota never makes a chunk unwritable. Everything a connection pins goes back when
it closes.

Leases are counted but never refused: a synchronous load on vLLM before 0.30 cannot report a
failed load (docs/connector.md), so a refused lease there would be wrong KV, not a miss. A client
whose leases alone pass its limit is logged once (a lease leak, most likely) and writes nothing
until it releases them. LOOKUP holds are not counted either: they end by themselves (``hold_ms``
is at most 600 s) and the same loads rely on them. Internal pins (a long tier reading a chunk's
bytes) are the daemon's own and count against no connection.
"""

from __future__ import annotations

import logging

from infera.kvd.chunk import Chunk

log = logging.getLogger("infera.kvd")


class PinBudget:
    """The bytes one connection pins, against its limit. Single-threaded (the loop's)."""

    __slots__ = ("leased", "limit", "over_warned", "refused", "used")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # None: no limit (``--client-quota 100``)
        self.used = 0  # bytes of its open reservations and of the distinct chunks it leases
        self.leased: dict[Chunk, int] = {}  # chunk -> the connection's open leases of it
        self.refused = 0  # PUT keys refused for this budget
        self.over_warned = False  # its leases alone passed the limit once (logged)

    @property
    def room(self) -> int | None:
        """Bytes it may still reserve (None: no limit)."""
        return None if self.limit is None else self.limit - self.used

    @property
    def over(self) -> bool:
        """It pins more than its limit (leases are never refused)."""
        return self.limit is not None and self.used > self.limit

    def reserved(self, chunk: Chunk) -> None:
        self.used += chunk.length

    def unreserved(self, chunk: Chunk) -> None:
        """A reservation of this connection was sealed or aborted."""
        self.used -= chunk.length

    def lease(self, chunk: Chunk) -> None:
        """One more lease of ``chunk``: its bytes count once, whatever the number of leases."""
        leased = self.leased
        n = leased.get(chunk)
        if n is None:
            self.used += chunk.length
            leased[chunk] = 1
        else:
            leased[chunk] = n + 1

    def release(self, chunk: Chunk) -> None:
        """One lease of ``chunk`` this connection held has ended."""
        leased = self.leased
        n = leased[chunk]
        if n == 1:
            del leased[chunk]
            self.used -= chunk.length
        else:
            leased[chunk] = n - 1

    def refuse(self, who: str) -> None:
        """A PUT key of ``who`` was refused for this budget: counted, and said the first time."""
        if not self.refused:
            log.warning(
                "%s reached its pin budget (%d of %d bytes leased or reserved): its further PUT keys "
                "are refused until it seals or releases some (--client-quota)",
                who,
                self.used,
                self.limit,
            )
        self.refused += 1

    def warn_over(self, who: str) -> None:
        """``who``'s leases passed its limit: said once (a lease leak, most likely)."""
        self.over_warned = True
        log.warning(
            "%s leases %d bytes, over its pin budget of %d: leases that are never released (a leak?) "
            "keep the others from that room; its PUTs are refused meanwhile",
            who,
            self.used,
            self.limit,
        )

    def clear(self) -> None:
        """The connection is gone with everything it pinned."""
        self.leased.clear()
        self.used = 0
