"""A chunk of the RAM tier and its policy state (retention class, leases, pins, where it sits in
the eviction queues); the index that holds them is :mod:`infera.kvd.flatindex`, which also keeps
each chunk's CLOCK access bit and LOOKUP hold (in its table, so a LOOKUP never touches a chunk)."""

from __future__ import annotations

from infera.kvd.keyspace import key_of, ns_id_of
from infera.kvd.protocol import RETENTION_CODE, RETENTIONS

NONE, EPHEMERAL, SHORT, LONG = (RETENTION_CODE[r] for r in RETENTIONS)
EVICTION_ORDER = (EPHEMERAL, SHORT, LONG)
# Chunk.parked: where a sealed, indexed chunk sits (see the module docstring)
IN_LRU, BUSY, HELD = 0, 1, 2  # eviction candidate / set aside leased or pinned / set aside held
GONE = 3  # no longer indexed (deleted, overwritten, evicted, expired)
COMPACT_MIN = 1024  # stale queue entries tolerated before a compaction is considered


class Chunk:
    """One chunk: a region of the arena plus its policy state."""

    __slots__ = (
        "expires",
        "ikey",
        "leases",
        "length",
        "offset",
        "on_long",
        "parked",
        "pins",
        "pred",
        "queued",
        "retention",
        "sealed",
        "succ",
        "zombie",
    )

    def __init__(self, ikey: bytes, offset: int, length: int, retention: int) -> None:
        self.ikey = ikey
        self.offset = offset
        self.length = length
        self.retention = retention
        self.sealed = False
        self.zombie = False
        self.leases = 0
        self.pins = 0  # internal holds (e.g. a long-tier write reading the bytes)
        self.expires = 0.0
        self.on_long = False
        self.parked = IN_LRU
        self.queued = 0  # entries of this chunk in its class's eviction deque (the last is live)
        # the chunk that followed this one in the last SEAL or GET/LEASE that had both (see link())
        self.succ: Chunk | None = None
        self.pred: Chunk | None = None

    @property
    def ns_id(self) -> int:
        return ns_id_of(self.ikey)

    @property
    def key(self) -> bytes:
        return key_of(self.ikey)


def link(a: Chunk, b: Chunk) -> None:
    """Remember that ``b`` came right after ``a`` (a prompt's next chunk): a GET or LEASE of a
    prompt then follows ``a.succ`` and compares one key instead of probing the index, whose random
    accesses grow with its size (a probe at 1M chunks misses every cache). A hint only, always
    checked against the key asked for; both ends indexed chunks; one successor and one
    predecessor each (a shared prefix keeps the branch seen last)."""
    if a.succ is b or a is b or a.parked == GONE or b.parked == GONE:
        return  # (a batch that wrote one key twice: its first chunk is already gone)
    if a.succ is not None:
        a.succ.pred = None
    if b.pred is not None:
        b.pred.succ = None
    a.succ, b.pred = b, a


def unlink_chain(c: Chunk) -> None:
    """``c`` leaves the index: no chunk may lead to it, and it leads to none."""
    if c.pred is not None:
        c.pred.succ = None
        c.pred = None
    if c.succ is not None:
        c.succ.pred = None
        c.succ = None


class ReserveResult:
    __slots__ = ("chunk", "error")

    def __init__(self, chunk: Chunk | None, error: str | None = None) -> None:
        self.chunk = chunk
        self.error = error


_FULL = ReserveResult(None, "full")  # shared: refusals carry no state
_QUOTA = ReserveResult(None, "quota")
