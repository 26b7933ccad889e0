"""The running disk tier's index journal and checkpoint rewrites (a mixin of :class:`~.disk.DiskTier`).

Every index change (a file landed, a file removed from the index) becomes a journal record; the
records of one loop iteration are written as one frame at its end (no fsync: :mod:`.diskjournal`
says what a crash or a power loss costs). When the journal holds more than ``CHECKPOINT_RECORDS``
records (or half the index, if larger) the loop opens the next generation's journal (records now
go to both) and a thread builds the new checkpoint from the files alone (the checkpoint with the
journal replayed up to that point: :func:`.diskindex.roll`) and writes it; once it is in place the
loop renames the next journal over the old one. The loop neither copies the index nor waits on the
disk for it. The checkpoint's order is the journal's (landing order), not the live LRU order.

A journal that cannot be written is removed (logged once): the next start then scans, or checks
the fan directories of a clean stop's checkpoint, instead of replaying an incomplete journal.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from infera.kvd import envvars
from infera.kvd.tiers import diskindex, diskjournal
from infera.units import format_size

if TYPE_CHECKING:
    from infera.kvd.tiers.base import TierHost

log = logging.getLogger("infera.kvd.disk")

CHECKPOINT_RECORDS = 262144  # journal records that trigger a checkpoint rewrite (at least)
RETRY_S = 60.0  # after a failed checkpoint rewrite


class CheckpointMixin:
    host: TierHost
    root_fd: int
    index: OrderedDict[bytes, int]
    loading: bool
    c: dict[str, int]

    def _init_journal(self) -> None:
        self.journal = diskjournal.Writer()
        self._ckpt_lock = threading.Lock()  # one checkpoint write at a time; a clean stop waits
        self._closing = False
        self._flush_soon = False
        self._rewriting = False
        self._next_records = 0
        self._retry_at = 0.0
        self._ckpt_records = int(envvars.get("INFERA_KVD_TEST_CHECKPOINT_RECORDS", CHECKPOINT_RECORDS))
        self._ckpt_delay = envvars.get(
            "INFERA_KVD_TEST_CHECKPOINT_DELAY_S", 0.0
        )  # lets tests kill mid-rewrite
        # fkeys the loop changed while the reconcile may be comparing (it never overrides them)
        self._touched: set[bytes] | None = set()

    # -- records ------------------------------------------------------------------------------
    def _note_landed(self, fkey: bytes, size: int) -> None:
        self.journal.landed(fkey, size)
        self._noted(fkey)

    def _note_removed(self, fkey: bytes) -> None:
        self.journal.removed(fkey)
        self._noted(fkey)

    def _noted(self, fkey: bytes) -> None:
        if self._touched is not None:
            self._touched.add(fkey)
        if not self._flush_soon and self.journal.fd is not None:
            self._flush_soon = True
            self.host.call_soon(self._flush_journal)

    def _flush_journal(self) -> None:
        self._flush_soon = False
        j = self.journal
        pending = j.count if j.next_fd is not None else 0
        try:
            j.flush()
        except OSError as exc:
            self._journal_broken("writing the index journal", exc)
            return
        self._next_records += pending
        bound = max(self._ckpt_records, len(self.index) // 2)
        if (
            j.records > bound
            and not self._rewriting
            and not self.loading
            and time.monotonic() >= self._retry_at
        ):
            self._start_checkpoint()

    def _journal_ready(self, fd: int, records: int) -> None:
        """Loop: the start settled the journal (:meth:`LoadMixin._settle_journal`)."""
        if self._closing:
            os.close(fd)
            return
        self.journal.fd, self.journal.records = fd, records
        self._flush_journal()

    def _journal_broken(self, what: str, exc: BaseException) -> None:
        if self.journal.broken:
            return
        self.journal.broken = True
        self.journal.close()
        self.journal.buf.clear()
        with contextlib.suppress(OSError):
            diskjournal.discard(self.root_fd)
        log.error(
            "disk tier: %s failed (%s); journal removed: the next start scans (or checks a clean "
            "stop's fan directories) instead of replaying it",
            *(what, getattr(exc, "strerror", None) or exc),
        )

    # -- checkpoint rewrites ---------------------------------------------------------------------
    def _start_checkpoint(self) -> None:
        """Loop, right after a flush: records from now on go to both journals; a thread builds the
        new checkpoint from the old one and the old journal up to here (the live index is not
        copied: that would hold the loop for a third of a second per million entries)."""
        j = self.journal
        generation = os.urandom(16)
        try:
            assert j.fd is not None
            journal_len = os.fstat(j.fd).st_size
            v1 = diskindex.v1_id(self.root_fd)
            next_fd = diskjournal.create(self.root_fd, diskjournal.NEXT_FILE, v1, generation)
        except OSError as exc:
            self._retry_at = time.monotonic() + RETRY_S
            log.warning("disk tier: cannot start an index checkpoint: %s", exc.strerror or exc)
            return
        j.next_fd, self._next_records, self._rewriting = next_fd, 0, True
        log.info("disk tier: index checkpoint started (journal: %d records)", j.records)
        args = (journal_len, generation)
        threading.Thread(
            target=self._write_checkpoint, args=args, name="kvd-disk-checkpoint", daemon=True
        ).start()

    def _write_checkpoint(self, journal_len: int, generation: bytes) -> None:
        """Thread: the new checkpoint, atomically; then the loop switches journals."""
        t = time.monotonic()
        if self._ckpt_delay:
            time.sleep(self._ckpt_delay)
        with self._ckpt_lock:
            if self._closing:
                return
            try:
                size = diskindex.roll(self.root_fd, journal_len, generation)
            except (OSError, diskindex.BadSnapshot) as exc:
                self.host.call_soon(functools.partial(self._checkpoint_failed, exc))
                return
        if self._ckpt_delay:
            time.sleep(self._ckpt_delay)
        self.host.call_soon(functools.partial(self._checkpointed, size, time.monotonic() - t))

    def _checkpointed(self, size: int, seconds: float) -> None:
        j = self.journal
        if self._closing or j.next_fd is None:
            return
        self._rewriting = False
        pending = j.count
        try:
            j.flush()
            os.rename(
                diskjournal.NEXT_FILE,
                diskjournal.JOURNAL_FILE,
                src_dir_fd=self.root_fd,
                dst_dir_fd=self.root_fd,
            )
        except OSError as exc:
            self._journal_broken("switching to the new index journal", exc)
            return
        if j.fd is not None:
            with contextlib.suppress(OSError):
                os.close(j.fd)
        j.fd, j.next_fd, j.records = j.next_fd, None, self._next_records + pending
        self.c["checkpoints_written"] += 1
        log.info(
            "disk tier: index checkpoint written (%s, %.3fs); journal restarted",
            *(format_size(size), seconds),
        )

    def _checkpoint_failed(self, exc: OSError | diskindex.BadSnapshot) -> None:
        self._rewriting = False
        self._retry_at = time.monotonic() + RETRY_S
        j = self.journal
        if j.next_fd is not None:
            with contextlib.suppress(OSError):
                os.close(j.next_fd)
            j.next_fd = None
        with contextlib.suppress(OSError):
            os.unlink(diskjournal.NEXT_FILE, dir_fd=self.root_fd)
        why = (exc.strerror if isinstance(exc, OSError) else None) or exc
        log.warning("disk tier: index checkpoint not written: %s (the journal keeps growing)", why)


__all__ = ["CHECKPOINT_RECORDS", "CheckpointMixin"]
