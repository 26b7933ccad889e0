"""The daemon's namespace table: name <-> id, the :class:`~infera.kvd.keyspace.Namespace` of an
id (text and digest), and when an id may be reused. The store owns it (``store.ns``); the ops, the
long tiers and STATS all read this one table.

A namespace name (at most 1024 characters, declared at HELLO) maps to an id in 0..65534; the index
keys chunks by ikey = ``id (2 bytes, big endian) + key`` (:mod:`infera.kvd.keyspace`). Ids used to
be handed out forever, so 65,535 HELLOs with new names (one connection did it in 1.1 s) locked
every new engine out until a restart.

Now an id is counted by the connections that use it and goes back to the free list only when it
cannot be referenced any more:

* no connection holds it, and
* nothing keyed by it can exist: the id was never used beyond HELLO (no PUT, GET, LOOKUP, ...; see
  ``used``), or -- without a long tier -- a scan of the RAM index and reservations found no chunk
  of it. The long tiers (tiers/disk.py, tiers/remote.py) keep ikeys in their queues and caches,
  so with one configured an id that was used is never reused; its name keeps mapping to it, so
  the namespace's chunks stay reachable when its engine comes back.

The :class:`Namespace` of an id (its digest is computed on first use) is forgotten when the id is
freed, so a reused id never answers with the digest of the namespace it had before.

A used id whose connections are gone keeps its name -> id mapping (its chunks are found again on
reconnect) until a reclaim frees it. Reclaims run only when the id space is exhausted, at most
once per :data:`RECLAIM_EVERY_S` (a scan of the index costs O(chunks)).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from infera.kvd import keyspace as ks
from infera.kvd.chunkfile import ns_digest
from infera.kvd.keyspace import Namespace

NS_IDS = 0xFFFF  # ids 0..65534
RECLAIM_EVERY_S = 5.0


class NamespaceTable:
    """Name <-> id table with reference counts, and the :class:`Namespace` of each id. Loop
    thread only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []  # id -> name
        self.refs: dict[int, int] = {}  # id -> connections using it
        self.used: set[int] = set()  # ids something beyond HELLO ran in (may have chunks)
        self.free: list[int] = []
        self.clock = clock
        self.reclaimable_used = True  # False with a long tier: a used id is never reused
        self.freed_total = 0
        self.refused_total = 0
        self._last_reclaim = float("-inf")
        self._by_id: dict[int, Namespace] = {}  # id -> Namespace, filled by of()
        self._by_prefix: dict[bytes, int] = {}  # namespace prefix -> id, of the namespaces in _by_id

    def __len__(self) -> int:
        return len(self.ids)

    def acquire(self, name: str, in_use: Callable[[], Iterable[bytes]] | None = None) -> int:
        """The id of ``name``, counted as used by one more connection. ``in_use`` yields the
        ikeys of every chunk and reservation, for a reclaim. Raises ValueError when none is free."""
        nid = self.ids.get(name)
        if nid is None:
            nid = self._new_id(in_use)
            self.ids[name] = nid
            self.names[nid] = name
        self.refs[nid] = self.refs.get(nid, 0) + 1
        return nid

    # -- the namespace of a key ---------------------------------------------------------------
    def of(self, ikey: bytes) -> Namespace:
        """The namespace ``ikey`` is keyed by (its digest computed once per id)."""
        nid = ks.ns_id_of(ikey)
        ns = self._by_id.get(nid)
        if ns is None:
            text = self.names[nid]
            ns = self._by_id[nid] = Namespace(nid, text, ns_digest(text))
            self._by_prefix[ns.prefix] = nid
        return ns

    def fkey(self, ikey: bytes) -> bytes:
        """The disk tier's key of ``ikey``."""
        return self.of(ikey).fkey(ks.key_of(ikey))

    def ikey_of(self, fkey: bytes) -> bytes | None:
        """The ikey of ``fkey``, if its namespace has been seen by :meth:`of` (else no chunk of
        it is in RAM that a long tier knows of)."""
        nid = self._by_prefix.get(ks.fkey_prefix(fkey))
        return None if nid is None else ks.ikey(nid, ks.fkey_key(fkey))

    # -- ids ----------------------------------------------------------------------------------
    def mark_used(self, nid: int) -> None:
        self.used.add(nid)

    def release(self, nid: int) -> None:
        """One connection stopped using ``nid``; free it at once if nothing can refer to it."""
        left = self.refs.get(nid, 0) - 1
        if left > 0:
            self.refs[nid] = left
            return
        self.refs.pop(nid, None)
        if nid not in self.used:
            self._free(nid)

    def _free(self, nid: int) -> None:
        name = self.names[nid]
        if self.ids.get(name) == nid:
            del self.ids[name]
        self.used.discard(nid)
        ns = self._by_id.pop(nid, None)
        if ns is not None and self._by_prefix.get(ns.prefix) == nid:
            del self._by_prefix[ns.prefix]
        self.free.append(nid)
        self.freed_total += 1

    def _new_id(self, in_use: Callable[[], Iterable[bytes]] | None) -> int:
        if not self.free and len(self.names) < NS_IDS:
            self.names.append("")
            return len(self.names) - 1
        if not self.free and in_use is not None:
            self.reclaim(in_use)
        if not self.free:
            self.refused_total += 1
            raise ValueError(f"too many namespaces: all {NS_IDS} namespace ids are in use")
        return self.free.pop()

    def reclaim(self, in_use: Callable[[], Iterable[bytes]]) -> int:
        """Free used ids that no connection holds and no chunk or reservation in RAM is keyed by
        (without a long tier only; rate-limited). Returns how many were freed."""
        now = self.clock()
        if not self.reclaimable_used or now - self._last_reclaim < RECLAIM_EVERY_S:
            return 0
        self._last_reclaim = now
        idle = {nid for nid in self.used if nid not in self.refs}
        if not idle:
            return 0
        held = ks.ns_ids_in(in_use())
        gone = [nid for nid in idle if nid not in held]
        for nid in gone:
            self._free(nid)
        return len(gone)
