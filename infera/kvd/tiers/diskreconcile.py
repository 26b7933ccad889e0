"""The disk tier's reconcile after a journal replay (a mixin of :class:`~.disk.DiskTier`).

A start after a crash trusts checkpoint + journal (:mod:`.diskjournal`) and serves at once; the
journal may miss the last records before the crash (or more, after a power loss). So a thread then
lists the tree (directory entries only: no file is opened or stat'ed but the ones not indexed) and
compares it with what was replayed: a chunk file not in the index gets the header check of the
scan and is indexed (``reconcile_added``); an index entry whose file is not there leaves the index
(``reconcile_dropped``). Anything the loop changed meanwhile (a write landed, a file evicted or
deleted) is left as the loop has it. The result goes to the loop in batches; ``reconcile`` in the
tier's stats is ``running``, then ``finished`` (``reconcile_s``), and one log line gives the counts.

Until it finishes, a chunk whose file landed but was never journaled is a miss (never wrong bytes),
and a listed file that is gone is a counted miss when read.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from infera.kvd import chunkfile as cf
from infera.kvd.tiers import diskscan

if TYPE_CHECKING:
    from infera.kvd.tiers.base import TierHost
    from infera.kvd.tiers.diskjournal import Writer

log = logging.getLogger("infera.kvd.disk")

BATCH = 4096


def list_fkeys(root_fd: int) -> set[bytes]:
    """The fkeys of every regular file under a chunk name in ``v1/<ns>/<fan>`` (names and entry
    types only; links are never followed)."""
    out: set[bytes] = set()
    try:
        vfd = cf.open_dir_at(root_fd, [cf.VERSION_DIR])
    except FileNotFoundError:
        return out
    try:
        for ns, ns8 in diskscan.namespace_dirs(vfd):
            nsfd = cf.open_dir_at(vfd, [ns])
            try:
                with os.scandir(nsfd) as it:
                    fans = [
                        e.name
                        for e in it
                        if diskscan.fan_byte(e.name) >= 0 and e.is_dir(follow_symlinks=False)
                    ]
                for fan in fans:
                    fanfd = cf.open_dir_at(nsfd, [fan])
                    try:
                        with os.scandir(fanfd) as it:
                            for e in it:
                                key = cf.key_from_name(e.name)
                                if key is not None and e.is_file(follow_symlinks=False):
                                    out.add(ns8 + key)
                    finally:
                        os.close(fanfd)
            finally:
                os.close(nsfd)
    finally:
        os.close(vfd)
    return out


class ReconcileMixin:
    host: TierHost
    root: str
    root_fd: int
    index: OrderedDict[bytes, int]
    bytes_used: int
    c: dict[str, int]
    journal: Writer
    _touched: set[bytes] | None
    _deleted_while_loading: set[bytes]
    # provided by DiskTier (annotations only)
    forget: Callable[[bytes], None]
    _make_room: Callable[[int], None]
    _note_landed: Callable[[bytes, int], None]

    reconcile: str | None = None  # None (not needed), "running", "finished" or "failed"
    reconcile_s: float | None = None

    def _start_reconcile(self, entries: list[tuple[bytes, int]]) -> None:
        """Loop, once the replayed index is in: compare it with the tree in the background."""
        self.reconcile, self._reconcile_t = "running", time.monotonic()
        args = (entries,)
        threading.Thread(target=self._reconcile, args=args, name="kvd-disk-reconcile", daemon=True).start()

    def _reconcile(self, entries: list[tuple[bytes, int]]) -> None:
        try:
            listed = list_fkeys(self.root_fd)
            known = {fk for fk, _size in entries}
            gone = [fk for fk in known if fk not in listed]
            found = []
            for fk in listed:
                if fk not in known:
                    v = diskscan.check_chunk(self.root_fd, fk)
                    if v.kind == diskscan.OK:
                        found.append((fk, v.size))
        except Exception as exc:
            log.exception("disk tier: reconcile failed")
            self.host.call_soon(functools.partial(self._reconciled, 0, f"{exc}"))
            return
        for i in range(0, len(gone), BATCH):
            self.host.call_soon(functools.partial(self._drop_gone, gone[i : i + BATCH]))
        for i in range(0, len(found), BATCH):
            self.host.call_soon(functools.partial(self._add_found, found[i : i + BATCH]))
        self.host.call_soon(functools.partial(self._reconciled, len(listed), ""))

    def _drop_gone(self, fkeys: list[bytes]) -> None:
        touched = self._touched or set()
        for fk in fkeys:
            if fk in self.index and fk not in touched:
                self.forget(fk)
                self.c["reconcile_dropped"] += 1

    def _add_found(self, found: list[tuple[bytes, int]]) -> None:
        touched = self._touched or set()
        index = self.index
        for fk, size in found:
            if fk in index or fk in touched or fk in self._deleted_while_loading:
                continue
            index[fk] = size
            index.move_to_end(fk, last=False)  # age unknown: evicted first
            self.bytes_used += size
            self._note_landed(fk, size)
            self.c["reconcile_added"] += 1
        self._make_room(0)

    def _reconciled(self, listed: int, failed: str) -> None:
        self._touched = None
        self.reconcile_s = round(time.monotonic() - self._reconcile_t, 3)
        if failed:
            self.reconcile = "failed"
            log.error("disk tier %s: reconcile failed after %.3fs: %s", self.root, self.reconcile_s, failed)
            return
        self.reconcile = "finished"
        log.info(
            "disk tier %s: reconcile finished in %.3fs: %d chunk files listed; %d indexed that the "
            "journal missed, %d entries dropped whose files are gone",
            *(self.root, self.reconcile_s, listed, self.c["reconcile_added"], self.c["reconcile_dropped"]),
        )


__all__ = ["ReconcileMixin", "list_fkeys"]
