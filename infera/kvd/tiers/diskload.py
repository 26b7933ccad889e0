"""The disk tier's index at start and at a clean stop (a mixin of :class:`~.disk.DiskTier`).

At start one thread restores the index (:func:`.diskindex.restore`: checkpoint + journal after a
crash, the checkpoint of a clean stop, else the scan of every file) and hands it to the loop in
batches; then it settles which journal the daemon appends to (:mod:`.diskjournal`): the one it
replayed, a new one for the checkpoint it adopted, or a new checkpoint of what it loaded and a new
journal. Index changes made before that are buffered. After a replayed journal the reconcile runs
(:mod:`.diskreconcile`). The journal and its checkpoint rewrites are in :mod:`.diskcheckpoint`. At
a clean stop, once no write can land any more, the index is written as the next start's checkpoint
and the journal removed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from infera.kvd import envvars
from infera.kvd.tiers import diskindex, diskjournal
from infera.units import format_size

if TYPE_CHECKING:
    from infera.kvd.tiers.base import TierHost
    from infera.kvd.tiers.pipeline import WriteThrough
    from infera.kvd.tiers.promotions import Promotions

log = logging.getLogger("infera.kvd.disk")

MERGE_BATCH = 4096


class LoadMixin:
    host: TierHost
    root: str
    root_fd: int
    capacity: int
    index: OrderedDict[bytes, int]
    bytes_used: int
    loading: bool
    index_load_s: float | None
    c: dict[str, int]
    writes: WriteThrough
    reads: Promotions
    _deleted_while_loading: set[bytes]
    _young_temps: list[str]
    _load_started: float
    # provided by DiskTier (annotations only)
    _busy: Callable[[bytes], tuple[bool, bool]]
    _make_room: Callable[[int], None]
    fail: Callable[[str, str], None]

    _start_reconcile: Callable[[list[tuple[bytes, int]]], None]
    _journal_ready: Callable[[int, int], None]
    _journal_broken: Callable[[str, BaseException], None]
    journal: diskjournal.Writer
    _ckpt_lock: threading.Lock
    _closing: bool
    _touched: set[bytes] | None

    index_source: str | None = None  # "snapshot", "snapshot+journal" or "scan" once loaded
    index_detail: str = ""

    def _load(self) -> None:
        delay = envvars.get("INFERA_KVD_TEST_LOAD_DELAY_S", 0.0)  # lets tests observe "loading"
        if delay:
            time.sleep(delay)
        loaded = diskindex.restore(self.root, self.root_fd)
        entries = loaded.entries  # oldest first; each batch goes to the LRU front, newest first
        for i in range(len(entries), 0, -MERGE_BATCH):
            self.host.call_soon(functools.partial(self._merge, entries[max(0, i - MERGE_BATCH) : i]))
        self.host.call_soon(lambda: self._loaded(loaded))
        self._settle_journal(loaded)

    def _settle_journal(self, loaded: diskindex.Loaded) -> None:
        """Load thread: the journal the daemon appends to from now on (under the checkpoint lock,
        so a clean stop never races it)."""
        with self._ckpt_lock:
            if self._closing:
                return
            try:
                v1 = diskindex.v1_id(self.root_fd)
                if loaded.replay is not None:
                    fd, records = diskjournal.reopen(self.root_fd, loaded.replay), len(loaded.replay.records)
                elif loaded.generation is not None:
                    fd, records = (
                        diskjournal.create(self.root_fd, diskjournal.JOURNAL_FILE, v1, loaded.generation),
                        0,
                    )
                else:  # a checkpoint of what was loaded; changes since are the buffered records
                    diskjournal.discard(self.root_fd)
                    generation = os.urandom(16)
                    entries = loaded.entries
                    diskindex.write(self.root_fd, entries, len(entries), generation, stamps=False)
                    fd, records = (
                        diskjournal.create(self.root_fd, diskjournal.JOURNAL_FILE, v1, generation),
                        0,
                    )
            except OSError as exc:
                self.host.call_soon(
                    functools.partial(self._journal_broken, "starting the index journal", exc)
                )
                return
        self.host.call_soon(functools.partial(self._journal_ready, fd, records))

    def _merge(self, batch: list[tuple[bytes, int]]) -> None:
        index = self.index
        skip = self._deleted_while_loading
        writing = self.writes.jobs
        for fkey, size in reversed(batch):
            if fkey in index or fkey in skip or (writing and self._busy(fkey)[1]):
                continue
            index[fkey] = size
            index.move_to_end(fkey, last=False)
            self.bytes_used += size

    def _loaded(self, loaded: diskindex.Loaded) -> None:
        result = loaded.result
        self.loading = False
        self.index_load_s = round(time.monotonic() - self._load_started, 3)
        self.index_source, self.index_detail = loaded.source, loaded.detail
        self._deleted_while_loading.clear()
        if loaded.replay is not None:
            self._start_reconcile(loaded.entries)
        else:
            self._touched = None
        self.c["files_other_version"] += result.other_version
        self.c["files_ignored"] += result.ignored
        self.c["quarantined"] += result.quarantined
        self.c["stale_temp_removed"] += result.stale_temps
        self._young_temps = result.young_temps
        for problem in result.unreadable:
            self.fail("scan", f"cannot read {problem}")
        for what, outcome in result.corrupt:
            self.reads.corrupt(what, outcome)
        if result.ignored:
            log.warning("disk tier: %d links, directories or FIFOs under chunk names ignored", result.ignored)
        self._evict_over_capacity()
        other = result.other_version
        how = (
            f"scanned {len(result.entries)} files ({loaded.detail})"
            if loaded.source == "scan"
            else f"index adopted from {loaded.source}, {len(loaded.entries)} chunks ({loaded.detail})"
        )
        log.info(
            "disk tier %s: %s; %d chunk files, %s of %s, indexed in %.3fs%s",
            *(self.root, how, len(self.index), format_size(self.bytes_used), format_size(self.capacity)),
            self.index_load_s,
            f"; {other} files of another format version left alone" if other else "",
        )

    def _evict_over_capacity(self) -> None:
        """Once loaded, the tier holds at most ``--long-bytes``: what is on disk beyond it is
        evicted now, least recently used first. That deletes files, and a capacity typed too
        small (256M for 256G) would empty a cache: a WARNING says how much went and why."""
        files, nbytes, evicted = len(self.index), self.bytes_used, self.c["evicted_files"]
        self._make_room(0)
        gone = self.c["evicted_files"] - evicted
        if gone and nbytes > self.capacity:
            log.warning(
                "disk tier %s: --long-bytes %s is below the %s of chunk files on disk: evicted %d of "
                "%d chunk files (%s) at start, least recently used first",
                *(self.root, format_size(self.capacity), format_size(nbytes), gone, files),
                format_size(nbytes - self.bytes_used),
            )

    def save_index(self, writes_stopped: bool) -> None:
        """A clean stop, after the last write: the index as the next start's checkpoint (with fan
        stamps) and the journal removed. Not when the index is incomplete (still loading) or a
        write may still land: then the journal stays, and the next start replays it."""
        with contextlib.suppress(OSError):
            self.journal.flush()
        self.journal.close()
        with self._ckpt_lock:
            self._closing = True
            if self.loading or not writes_stopped:
                why = "the index was still loading" if self.loading else "writes were still running"
                log.warning(
                    "disk tier: clean stop: no index checkpoint written (%s); the next start replays "
                    "the journal if there is one, else scans",
                    why,
                )
                return
            t = time.monotonic()
            try:
                size = diskindex.write(self.root_fd, self.index.items(), len(self.index))
                diskjournal.discard(self.root_fd)
            except OSError as exc:
                log.warning("disk tier: clean stop: cannot write the index snapshot: %s", exc.strerror or exc)
                return
        log.info(
            "disk tier: clean stop: index snapshot of %d chunks written (%s, %.3fs)",
            *(len(self.index), format_size(size), time.monotonic() - t),
        )


__all__ = ["MERGE_BATCH", "LoadMixin"]
