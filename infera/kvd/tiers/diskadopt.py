"""The disk tier's chunk files written by clients (GPU-direct): ADOPT indexes them, and what a
client could not write goes through the usual write path (a mixin of :class:`~.disk.DiskTier`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from infera.kvd import chunkfile as cf
from infera.kvd.store import LONG
from infera.kvd.tiers import diskscan

if TYPE_CHECKING:
    from infera.kvd.namespaces import NamespaceTable
    from infera.kvd.store import Store
    from infera.kvd.tiers.pipeline import WriteThrough


class AdoptMixin:
    store: Store
    ns: NamespaceTable
    root_fd: int
    index: OrderedDict[bytes, int]
    c: dict[str, int]
    writes: WriteThrough
    # provided by DiskTier (annotations only)
    _put: Callable[[bytes, int], None]
    _make_room: Callable[[int], None]

    def adopt(self, ikeys: list[bytes], lengths: list[int]) -> int:
        """Index chunk files a client wrote under our root (a header check each, on the loop:
        the header was just written, so it is in the page cache). A key whose file is missing or
        unusable is written through from RAM if RAM holds it."""
        n = 0
        for ikey, length in zip(ikeys, lengths, strict=True):
            fkey = self.ns.fkey(ikey)
            v = diskscan.check_chunk(self.root_fd, fkey)
            if v.kind != diskscan.OK or v.size != cf.HEADER_SIZE + length:
                self.c["adopt_missing"] = self.c.get("adopt_missing", 0) + 1
                self.c["files_ignored"] += v.kind == diskscan.IGNORED
                self.write_through([ikey])
                continue
            self.writes.cancel(ikey)
            self._put(fkey, v.size)
            chunk = self.store.index.get(ikey)
            if chunk is not None:
                chunk.on_long = True
            n += 1
        self.c["adopted"] = self.c.get("adopted", 0) + n
        self._make_room(0)
        return n

    def write_through(self, ikeys: list[bytes]) -> int:
        """Chunks a client meant to persist itself but could not: write them the usual way."""
        n = 0
        for ikey in ikeys:
            # the client's SEAL may still be on its way: a pending chunk is written at its seal
            chunk = self.store.index.get(ikey) or self.store.pending.get(ikey)
            if chunk is None or chunk.retention != LONG or self.ns.fkey(ikey) in self.index:
                continue
            chunk.on_long = False
            if chunk.sealed:
                self.writes.on_seal(chunk)
            n += 1
        return n
