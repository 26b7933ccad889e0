"""The worker's GPU-direct L3 plumbing: file reads into staging, file writes from a GPU pool.

Selection (which backend, or why none) is :func:`infera.engine.vllm.worker.gpu.gpudirect.select`; this
module is what the worker does with a backend once it has one:

* **reads**: a chunk the daemon holds only on disk (a ``ram_only`` GET leaves it out) is read
  from its chunk file straight into the load staging buffer, verified there (``wsum31`` on the
  GPU; a daemon-written ``xxh3`` file on the host) and scattered like an arena chunk;
* **writes**: a ``long`` chunk is reserved with ``persisted`` (the daemon skips its own
  write-through), copied from the save staging into a bounded GPU write pool on the gather
  stream, and written by one writer thread; the file is then ADOPTed (the disk tier indexes it)
  or, if the write failed, handed back for the daemon to write through. When the pool is full the
  chunk simply takes the daemon's path: GPU-direct writes never stall a step.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch

from infera.engine.vllm.worker.gpu.copier import GpuCopier
from infera.engine.vllm.worker.gpu.gdfiles import ChunkFiles
from infera.engine.vllm.worker.gpu.gpudirect import Selection
from infera.engine.vllm.worker.gpu.runtime import QueueThread
from infera.kvd.chunkfile import ChunkFileError
from infera.kvd.client import KvdClient, KvdClientError

log = logging.getLogger("infera.engine.vllm")

DEFAULT_WRITE_BYTES = 256 << 20


class GdPath:
    def __init__(
        self, sel: Selection, copier: GpuCopier, namespace: str, write_bytes: int = DEFAULT_WRITE_BYTES
    ) -> None:
        assert sel.api is not None
        self.sel = sel
        self.copier = copier
        self.files = ChunkFiles(sel.api, sel.root, namespace)
        self.chunk_bytes = copier.chunk_bytes
        slots = max(2, write_bytes // self.chunk_bytes)
        self.pool = torch.empty((slots, self.chunk_bytes), dtype=torch.uint8, device=copier.device)
        self._free = list(range(slots))
        self._lock = threading.Lock()
        self._writer = QueueThread[tuple[Any, KvdClient, bytes, int]]("kvd-gd-write", self._write_one, 30)
        self.daemon_reason: str | None = None
        self.counters: dict[str, int] = {}

    # -- state --------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.daemon_reason is None

    def reasons(self) -> list[str]:
        return [*self.sel.reasons, *([self.daemon_reason] if self.daemon_reason else [])]

    def connect(self, client: KvdClient) -> None:
        """The daemon must index our files: its disk tier has to live in our root."""
        theirs = client.long_path
        if client.long_tier != "disk" or not theirs:
            self.daemon_reason = (
                f"the daemon has no disk long tier (long tier: {client.long_tier or 'none'}), so it "
                "could not index files written here"
            )
        elif os.path.realpath(theirs) != os.path.realpath(self.sel.root):
            self.daemon_reason = (
                f"INFERA_KVD_HIPFILE_ROOTS long={self.sel.root} is not the daemon's --long-path {theirs}"
            )
        else:
            self.daemon_reason = None

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def all_counters(self) -> dict[str, int]:
        return {**self.counters, **self.files.counters}

    # -- reads --------------------------------------------------------------------------------
    def read_into(self, key: bytes, out: torch.Tensor) -> bool:
        try:
            self.files.read(key, out)
            return True
        except FileNotFoundError:
            self._count("gd_read_missing")
        except ChunkFileError as exc:
            self._count("gd_read_bad")
            log.warning("infera-kvd: GPU-direct read of %s refused: %s", self.files.path(key), exc)
        except Exception as exc:
            self._count("gd_read_errors")
            log.warning("infera-kvd: GPU-direct read of %s failed: %s", self.files.path(key), exc)
        return False

    # -- writes -------------------------------------------------------------------------------
    def take_slot(self) -> int | None:
        with self._lock:
            if self._free:
                return self._free.pop()
        self._count("gd_write_pool_full")
        return None

    def _give_slot(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    def queue_write(self, client: KvdClient, key: bytes, slot: int, staged: torch.Tensor) -> None:
        """Copy ``staged`` (on the gather stream, after the gather) and write it in the background."""
        ops = self.copier.ops
        with ops.use(self.copier.gather_stream):
            self.pool[slot].copy_(staged)
            event = ops.record(self.copier.gather_stream)
        self._writer.put((event, client, key, slot))

    def _write_one(self, item: tuple[Any, KvdClient, bytes, int]) -> None:
        event, client, key, slot = item
        try:
            self.copier.ops.sync(event)
            try:
                self.files.write(key, self.pool[slot])
                ok = True
            except Exception as exc:
                ok = False
                log.warning("infera-kvd: GPU-direct write of %s failed: %s", self.files.path(key), exc)
        finally:
            self._give_slot(slot)
        try:
            if ok:
                client.adopt([key], [self.chunk_bytes])
                self._count("gd_adopted")
            else:
                client.adopt([], [], failed=[key])
                self._count("gd_write_handed_back")
        except KvdClientError as exc:
            self._count("gd_adopt_errors")
            log.debug("infera-kvd: ADOPT failed: %s", exc)

    def drain(self) -> None:
        self._writer.drain()

    def close(self) -> None:
        self._writer.close()
        if self.sel.api is not None:
            self.sel.api.driver_close()
