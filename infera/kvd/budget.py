"""How much of the arena one connection may keep from eviction: its pin budget (``--client-quota``).

A connection keeps arena bytes from eviction three ways:

* its reservations, from PUT until it seals or aborts them;
* the chunks it leases, from GET until it releases them;
* the chunks it holds with LOOKUP ``hold_ms``, until the hold ends.

A chunk leased and held, or leased several times, counts once: it occupies its bytes once. The
sum may not pass the connection's limit:

* A PUT key that would pass it gets the per-key error ``quota`` instead of a slot
  (``put_rejected_quota_total``; said once in the daemon's log). A connection that pins nothing
  may still reserve one chunk of any size the arena holds, so the quota never makes a chunk
  unwritable.
* A hold that would pass it is not taken (``holds_refused_quota_total``): LOOKUP still counts the
  chunk, and its reply's ``held`` says how many leading chunks are held for this connection, so a
  client that needs them kept (a synchronous load on vLLM before 0.30) offers no more than that.
* A lease is counted but never refused: that same synchronous load cannot report a failed read,
  so a refused lease there would be wrong KV, not a miss. A client whose leases pass its limit is
  logged once (a lease leak, most likely) and writes and holds nothing more until it releases.

Everything but the holds goes back when the connection closes; a hold it took lasts until its end
(``hold_ms`` is at most 600 s), since another connection may hold the same chunk. Internal pins (a
long tier reading a chunk's bytes) are the daemon's own and count against no connection.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterable

from infera.kvd.chunk import Chunk

log = logging.getLogger("infera.kvd")

# A renewed hold is written down again only when it moves its end by more than this: the
# connector renews the same holds every engine step. The budget may then end a hold up to this
# much before the index does (the daemon keeps the chunk that little longer).
HOLD_SLACK_S = 1.0


class PinBudget:
    """The bytes one connection pins, against its limit. Single-threaded (the loop's)."""

    __slots__ = ("_seq", "expiry", "held", "limit", "over_warned", "refs", "refused", "used")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # None: no limit (``--client-quota 100``)
        self.used = 0  # bytes of its open reservations and of the distinct chunks it leases or holds
        self.refs: dict[Chunk, int] = {}  # chunk -> its open leases, plus one while it holds it
        self.held: dict[Chunk, float] = {}  # chunk -> when its hold ends, as written down
        self.expiry: list[tuple[float, int, Chunk]] = []  # (end, seq, chunk) of holds, soonest first
        self._seq = itertools.count()
        self.refused = 0  # PUT keys refused for this budget
        self.over_warned = False  # its leases passed the limit once (logged)

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

    # -- leases and holds: each chunk counted once -------------------------------------------------
    def _pin(self, chunk: Chunk) -> None:
        n = self.refs.get(chunk)
        if n is None:
            self.used += chunk.length
            self.refs[chunk] = 1
        else:
            self.refs[chunk] = n + 1

    def _unpin(self, chunk: Chunk) -> None:
        n = self.refs[chunk]
        if n == 1:
            del self.refs[chunk]
            self.used -= chunk.length
        else:
            self.refs[chunk] = n - 1

    def lease(self, chunk: Chunk) -> None:
        """One more lease of ``chunk``, never refused."""
        self._pin(chunk)

    def release(self, chunk: Chunk) -> None:
        """One lease of ``chunk`` this connection held has ended."""
        self._unpin(chunk)

    def hold(self, chunks: Iterable[Chunk], until: float, now: float) -> int:
        """Hold ``chunks`` until ``until``, in order, while the budget allows: how many it holds
        (the rest are not held). A chunk this connection already pins costs nothing more."""
        self.expire(now)
        limit, refs, held = self.limit, self.refs, self.held
        n = 0
        for chunk in chunks:
            end = held.get(chunk)
            if end is None:
                if chunk not in refs and limit is not None and self.used + chunk.length > limit:
                    break
                self._pin(chunk)
            elif until <= end + HOLD_SLACK_S:
                n += 1
                continue
            held[chunk] = until
            heapq.heappush(self.expiry, (until, next(self._seq), chunk))
            n += 1
        if len(self.expiry) > 2 * len(held) + 1024:  # mostly renewed entries: keep the live ones
            self.expiry = [(end, next(self._seq), ch) for ch, end in held.items()]
            heapq.heapify(self.expiry)
        return n

    def expire(self, now: float) -> None:
        """Holds whose end has passed stop counting."""
        heap, held = self.expiry, self.held
        while heap and heap[0][0] <= now:
            end, _, chunk = heapq.heappop(heap)
            if held.get(chunk) == end:
                del held[chunk]
                self._unpin(chunk)

    # -- what it says ---------------------------------------------------------------------------
    def refuse(self, who: str) -> None:
        """A PUT key of ``who`` was refused for this budget: counted, and said the first time."""
        if not self.refused:
            log.warning(
                "%s reached its pin budget (%d of %d bytes leased, held or reserved): its further PUT "
                "keys and holds are refused until some end (--client-quota)",
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
            "keep the others from that room; its PUTs and holds are refused meanwhile",
            who,
            self.used,
            self.limit,
        )

    def clear(self) -> None:
        """The connection is gone with everything it pinned (its holds end at their time)."""
        self.refs.clear()
        self.held.clear()
        self.expiry.clear()
        self.used = 0
