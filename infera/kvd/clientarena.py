"""The client's reads and writes through the daemon's shared arena.

:class:`infera.kvd.client.KvdClient` builds on it; this part maps the arena passed at HELLO and
copies through it: PUT (reserve), fill, SEAL; GET (lease), copy, RELEASE. Each region reserved or
leased is first populated in this client's mapping (:mod:`infera.kvd.populate`).
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable, Sequence
from typing import Any

from infera.kvd import protocol as P
from infera.kvd.clientnet import KvdArenaError, KvdClientError, error_of
from infera.kvd.clientwire import Wire
from infera.kvd.populate import Populated
from infera.kvd.protocol import ArenaFdError, map_arena

Buffer = bytes | bytearray | memoryview


# a PUT slot's refusals that leave no room, and what put() says when nothing was stored
_NO_ROOM = {
    "full": "the kvd arena is full (every chunk is leased or being written)",
    "too_large": "the chunk is larger than the whole kvd arena",
    "quota": "this connection already pins its share of the kvd arena (--client-quota)",
}


class ArenaIO(Wire):
    """The arena as this connection mapped it, and the requests that copy through it."""

    def __init__(self, socket_path: str, spin_s: float) -> None:
        super().__init__(socket_path, spin_s)
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._populated: Populated | None = None  # what this mapping has faulted in
        self.arena_size = 0

    def _map_arena(self, fd: int, size: int) -> None:
        """Map the arena descriptor passed at HELLO (``size`` bytes, as the daemon announced)."""
        try:
            self._map = map_arena(fd, size)
        except ArenaFdError as exc:
            raise KvdArenaError(
                f"the arena descriptor from {self.socket_path} is unusable: {exc}",
                hint="is this a kvd daemon of this version? restart it, or check what listens there",
            ) from None
        self._view = memoryview(self._map)
        self._populated = Populated(self._map, size)

    def _unmap(self) -> None:
        """Give up the mapping (from ``close``)."""
        view, self._view = self._view, None
        if view is not None:
            with contextlib.suppress(BufferError):
                view.release()
        mapped, self._map = self._map, None
        if mapped is not None:
            with contextlib.suppress(BufferError):
                mapped.close()

    @property
    def arena(self) -> memoryview:
        if self._view is None:
            raise KvdClientError("this client was opened with want_arena=False")
        return self._view

    def _ready(self, offset: Any, length: Any) -> None:
        """A region is about to be copied: populate it in this mapping (:mod:`infera.kvd.populate`)."""
        if self._populated is not None:
            self._populated.ensure(offset, length)

    def pages_present(self) -> None:
        """Every page of this mapping is in its page tables already (a GPU worker registered it
        with ``cudaHostRegister``, which pins and maps every page): regions are no longer populated
        before they are copied, which would walk them again on the first LEASE of each (on the H200,
        run I, the first LEASE of a 2 GiB prompt's regions took 101 ms against 61 ms for the next
        ones; not yet measured without it)."""
        if self._populated is not None:
            self._populated.enabled = False

    def prefault(self) -> None:
        """Populate the whole arena in this client's mapping now (as a long-lived client has once
        it has touched every region); commits the arena's memory."""
        self._ready(0, self.arena_size)

    # -- public API -------------------------------------------------------------------------
    def put(self, key: bytes, data: Buffer, retention: str = "long", overwrite: bool = False) -> bool:
        """Store ``data`` under ``key``. Returns False when nothing was stored (``none``
        retention, or the key is already present / being written and ``overwrite`` is False).
        Raises KvdFull when the arena cannot make room.

        One round trip: the seal is sent without waiting for its reply. The chunk is visible to
        every request the daemon reads after the seal, which includes every later request of
        this client; a request another process sends at the same instant may still miss it."""
        return self.put_many([(key, data)], retention=retention, overwrite=overwrite)[0]

    def put_many(
        self, items: Sequence[tuple[bytes, Buffer]], retention: str = "long", overwrite: bool = False
    ) -> list[bool]:
        """Store several chunks with one round trip in all (reserve; the seal rides along)."""
        if retention not in P.RETENTION_CODE:
            raise ValueError(f"retention must be one of {', '.join(P.RETENTIONS)} (got {retention!r})")
        keys = [P.check_key(k) for k, _ in items]
        views = [memoryview(d).cast("B") for _, d in items]
        reply = self.request(
            "PUT", keys=keys, lengths=[v.nbytes for v in views], retention=retention, overwrite=overwrite
        )
        slots = reply.get("slots", [])
        arena = self.arena
        tokens: list[int] = []
        stored: list[bool] = []
        full_error: str | None = None
        for slot, view in zip(slots, views, strict=True):
            if isinstance(slot, list):
                token, off = slot
                self._ready(off, view.nbytes)
                arena[off : off + view.nbytes] = view
                tokens.append(token)
                stored.append(True)
            else:
                if slot in _NO_ROOM:
                    full_error = slot
                stored.append(False)
        if tokens:
            self.notify("SEAL", tokens=tokens)
        if full_error is not None and not any(stored):
            raise error_of({"error": full_error, "message": _NO_ROOM[full_error]})
        return stored

    def reserve(
        self,
        keys: Sequence[bytes],
        lengths: Sequence[int],
        retention: str = "long",
        overwrite: bool = False,
        persisted: bool = False,
    ) -> list[tuple[int, int] | str]:
        """Low-level: reserve regions; each slot is ``(token, offset)`` or a reason string.
        Fill ``client.arena[offset:offset+length]`` and then :meth:`seal` the tokens.
        ``persisted``: this client writes the long-tier files itself and :meth:`adopt`s them."""
        fields: dict[str, Any] = {}
        if persisted:
            fields["persisted"] = True
        reply = self.request(
            "PUT",
            keys=[P.check_key(k) for k in keys],
            lengths=list(lengths),
            retention=retention,
            overwrite=overwrite,
            **fields,
        )
        slots = [tuple(s) if isinstance(s, list) else s for s in reply["slots"]]
        for slot, n in zip(slots, lengths, strict=False):
            if isinstance(slot, tuple) and len(slot) == 2:  # about to be filled
                self._ready(slot[1], n)
        return slots  # type: ignore[return-value]

    def seal(self, tokens: Sequence[int], wait: bool = True) -> None:
        if not tokens:
            return
        if wait:
            self.request("SEAL", tokens=list(tokens))
        else:
            self.notify("SEAL", tokens=list(tokens))

    def abort(self, tokens: Sequence[int]) -> None:
        if tokens:
            self.notify("ABORT", tokens=list(tokens))

    def get(self, key: bytes) -> bytes | None:
        """Return a copy of the chunk stored under ``key``, or None."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        leases = self.lease([P.check_key(k) for k in keys])
        arena = self.arena
        out: list[bytes | None] = []
        tokens: list[int] = []
        for item in leases:
            if item is None:
                out.append(None)
                continue
            token, off, length = item
            out.append(bytes(arena[off : off + length]))
            tokens.append(token)
        self.release(tokens)
        return out

    def get_into(self, key: bytes, buffer: Buffer) -> int | None:
        """Copy the chunk under ``key`` into ``buffer`` (no intermediate copy). Returns the
        number of bytes written, or None on a miss. A buffer smaller than the chunk is a
        ValueError (nothing is written)."""
        target = memoryview(buffer).cast("B")
        if target.readonly:
            raise ValueError("get_into needs a writable buffer")
        (item,) = self.lease([P.check_key(key)])
        if item is None:
            return None
        token, off, length = item
        try:
            if length > target.nbytes:
                raise ValueError(f"buffer of {target.nbytes} bytes is too small for a {length}-byte chunk")
            target[:length] = self.arena[off : off + length]
        finally:
            self.release([token])
        return length

    def lease(self, keys: Sequence[bytes], ram_only: bool = False) -> list[tuple[int, int, int] | None]:
        """Low-level: lease chunks; each item is ``(lease, offset, length)`` or None. The region
        stays valid until :meth:`release`. ``ram_only``: chunks only the long tier holds come
        back as None instead of being read into RAM (the caller reads them itself)."""
        reply = self.request("GET", keys=list(keys), **({"ram_only": True} if ram_only else {}))
        items = [tuple(i) if i is not None else None for i in reply["items"]]
        for item in items:
            if item is not None and len(item) == 3:  # about to be read
                self._ready(item[1], item[2])
        return items  # type: ignore[return-value]

    def release(self, leases: Iterable[int]) -> None:
        tokens = list(leases)
        if tokens:
            self.notify("RELEASE", leases=tokens)


__all__ = ["ArenaIO", "Buffer"]
