"""The interface a distributed long-tier backend implements, and the checks every value passes.

A backend's :class:`Transport` moves whole values (a 4 KiB chunk-file header followed by the
payload) to and from one store; :mod:`infera.kvd.tiers.remote` does everything else.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NamedTuple

from infera.kvd import chunkfile as cf

HEADER = cf.HEADER_SIZE


class TransportError(Exception):
    """A failed store operation. ``kind``: ``missing`` (no such value), ``full`` (the store has no
    room: backpressure), ``corrupt`` (a value that cannot be a chunk), ``down`` (not reachable) or
    ``error`` (anything else)."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


class Region(NamedTuple):
    """A piece of memory a transport reads into or writes from: the view, and its address for
    stores that take raw pointers to registered memory."""

    view: memoryview
    ptr: int


class Transport:
    """One backend's client. Every method may block and is called from tier threads only."""

    backend = "?"
    endpoint = ""

    def probe(self) -> None:
        """Raise TransportError (kind ``down``) unless the store answers, within about a second."""
        raise NotImplementedError

    def connect(self, arena: Region, slots: Region) -> None:
        """Open the client; ``arena`` and ``slots`` (header buffers) are what reads and writes use."""
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        raise NotImplementedError

    def name(self, digest: bytes, key: bytes) -> str:
        """The store's name for chunk ``key`` of the namespace with digest ``digest``: one of the
        formulas of :mod:`infera.kvd.keyspace` (existing values must stay readable)."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def exists_many(self, names: list[str]) -> list[bool]:
        """One answer per name; stores with a batch call override this with one round trip."""
        return [self.exists(n) for n in names]

    def fetch(self, name: str, header: Region, alloc: Callable[[int], Region | None]) -> Region | None:
        """Read value ``name``: its first HEADER bytes into ``header``, the rest into the region
        ``alloc(payload_length)`` returns (None there: no room, give up and return None)."""
        raise NotImplementedError

    def put(self, name: str, header: Region, payload: Region, replace: bool) -> None:
        raise NotImplementedError

    def remove(self, name: str) -> bool:
        raise NotImplementedError

    def reset(self) -> None:
        """Called by the monitor when the store stopped answering (drop stale connections)."""

    def interrupt(self) -> None:
        """Called (from any thread) when the tier stops: end a connect under way if it can."""

    def close(self) -> None:
        raise NotImplementedError


def buffer_address(buf: Any) -> int:
    """Address of a writable buffer (the arena mapping, a slot pool), without keeping it exported."""
    obj = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(obj)
    finally:
        del obj


def verify(header_buf: memoryview, payload: memoryview, digest: bytes, key: bytes) -> cf.ChunkHeader:
    """Check a value read from the store like a chunk file (raises cf.ChunkFileError)."""
    header = cf.ChunkHeader.unpack(header_buf)
    if header.key != key:
        raise cf.CorruptChunk("value holds another key than its name says")
    if header.namespace_digest != digest:
        raise cf.CorruptChunk("value belongs to another namespace than its name says")
    if header.payload_length != payload.nbytes:
        raise cf.CorruptChunk(
            f"header says {header.payload_length} payload bytes, value holds {payload.nbytes}"
        )
    if cf.checksum(header.algo, payload) != header.payload_checksum:
        raise cf.CorruptChunk(f"payload checksum mismatch ({cf.ALGO_NAMES.get(header.algo, header.algo)})")
    return header


__all__ = ["HEADER", "Region", "Transport", "TransportError", "buffer_address", "verify"]
