"""The contract between the daemon and its long tier, and between a tier and its I/O.

Three layers, top to bottom:

* **The server** holds one :class:`LongTier` (``Server.long``) and gives it a :class:`TierHost`
  (the store, the arena and ``call_soon``: nothing else of the daemon). ``op_get`` reads RAM
  misses through :meth:`LongTier.fetch` and counts the keys found nowhere itself
  (:meth:`LongTier.count_misses`); LOOKUP asks :meth:`LongTier.contains_many`; ADOPT needs a
  :class:`FileBackedTier`.
* **The pipelines** are the same for every tier: :class:`~.pipeline.WriteThrough` (seal hook,
  queue and pin budgets, backlog, cancel, retries with back-off, completion accounting, the
  clean stop's last attempt) and :class:`~.promotions.Promotions` (read jobs, waiters, pinning
  what RAM holds, deadlines, room in the arena, corrupt accounting). Both keep their state on
  the loop thread and run the blocking part on their own worker threads.
* **A tier** is one class that passes itself to both pipelines as their I/O adapter
  (:class:`~.pipeline.WriteBackend`, :class:`~.promotions.ReadBackend`, beside the pipeline
  that calls them) and keeps only what is its own: the disk tier its file index, capacity and
  eviction, scan and ADOPT (:mod:`.disk`); the distributed tier names, its known-cache, resync
  and batched existence calls (:mod:`.remote`) over a :class:`~.transport.Transport`.

A third backend is one I/O adapter:

* another networked store: a :class:`~.transport.Transport` (probe, connect, name,
  exists_many, fetch, put, remove, reset, close) and a ten-line :class:`~.remote.RemoteTier`
  subclass that builds it from the config (see :mod:`.lmcache`); add it to ``tiers.BACKENDS``.
* anything else: one class implementing :class:`LongTier` with these hooks (plus the
  attributes ``ns``, ``c``, ``label``, ``log`` and ``last_error`` the pipelines read):

  =================================  =======================================================
  ``address(chunk, ns)``             where a chunk goes (file key, value name); None: never
  ``accepting()``                    False while writes must wait (unreachable, backpressure)
  ``admitted(job)``                  a write was queued (the disk tier makes room for it)
  ``write(job)``                     writer thread: the blocking write; the error or None
  ``landed(job)``, ``failed(job, e)``  loop thread: bookkeeping after a write
  ``locate(ikey, ns)``               (address, payload length or None) if the tier has it
  ``start(job)``                     reader thread: fill ``job.chunk``, or the region
                                     ``Promotions.room(job, length)`` returns; the outcome
  ``promoted(job)``, ``read_failed``  loop thread: bookkeeping after a read
  =================================  =======================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from infera.kvd.arena import Arena
    from infera.kvd.store import Store


class TierHost(Protocol):
    """What a long tier may use of the daemon that owns it."""

    @property
    def store(self) -> Store: ...

    @property
    def arena(self) -> Arena: ...

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread (callable from any thread)."""


@dataclass(frozen=True)
class Host:
    """The :class:`TierHost` the server hands its long tier."""

    store: Store
    arena: Arena
    call_soon: Callable[[Callable[[], None]], None]


class LongTier(Protocol):
    """The long tier as the server uses it (loop thread only)."""

    backend: str

    @property
    def loading(self) -> bool:
        """True until the tier can answer for what it holds (index rebuilt, first connection)."""

    def contains(self, ikey: bytes) -> bool: ...

    def contains_many(self, ikeys: list[bytes]) -> list[bool]:
        """One answer per key (the distributed tier asks its store once for all of them)."""

    def fetch(self, ikeys: Iterable[bytes], on_ready: Callable[[], None]) -> bool:
        """Start reading the RAM misses among ``ikeys``. True: ``on_ready`` runs on the loop
        thread once every read has finished (or the tier's deadline passed), and what RAM holds
        of ``ikeys`` stays there until then. False: nothing to wait for."""

    def prewarm(self, ikeys: list[bytes]) -> int:
        """Queue background reads; how many were queued."""

    def read_rate(self) -> float | None:
        """GB/s the tier's recent reads into RAM ran at (None until it has read anything)."""

    def delete(self, ikeys: list[bytes]) -> int:
        """Forget ``ikeys`` (and remove what is stored); how many the tier knew it held."""

    def count_misses(self, n: int) -> None:
        """``n`` GET keys were found neither in RAM nor on this tier."""

    def tick(self) -> None:
        """Once a second, on the loop thread."""

    def stats(self) -> dict[str, Any]:
        """The ``tiers.long`` section of STATS."""

    def close(self) -> None:
        """A clean stop: last writes, then every thread stops (before the arena goes)."""


@runtime_checkable
class FileBackedTier(LongTier, Protocol):
    """A long tier of chunk files under ``root``, which clients may write themselves (ADOPT)."""

    root: str

    def adopt(self, ikeys: list[bytes], lengths: list[int]) -> int:
        """Index chunk files a client wrote; how many were usable."""

    def write_through(self, ikeys: list[bytes]) -> int:
        """Write chunks a client meant to persist itself but could not."""


__all__ = ["FileBackedTier", "Host", "LongTier", "TierHost"]
