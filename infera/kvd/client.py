"""``KvdClient``: the library engines, tools and users' scripts use to talk to a kvd daemon.

Reads and writes go through the shared arena: a ``put`` reserves a region, copies the bytes into
the mapped arena and seals it; a ``get`` leases a region, copies it out and releases the lease
(the release rides along without waiting for a reply, so a read costs one round trip). Each
region reserved or leased is first populated in this client's mapping (:mod:`infera.kvd.populate`).
The client is thread-safe (one lock around each request) and raises only ``KvdClientError``s.

Connecting, and what the client checks before it trusts a daemon: :mod:`infera.kvd.clientnet`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from infera.kvd import protocol as P
from infera.kvd.clientnet import (
    TRUST_ENV,
    KvdArenaError,
    KvdClientError,
    KvdFull,
    KvdProtocolError,
    KvdQuota,
    KvdRefused,
    KvdUnavailable,
    KvdUnsupported,
    KvdUntrusted,
    check_peer,
    connect,
    default_spin,
    error_of,
)
from infera.kvd.clientwire import Wire
from infera.kvd.populate import Populated
from infera.kvd.protocol import ArenaFdError, default_socket_path, map_arena

Buffer = bytes | bytearray | memoryview


# a PUT slot's refusals that leave no room, and what put() says when nothing was stored
_NO_ROOM = {
    "full": "the kvd arena is full (every chunk is leased or being written)",
    "too_large": "the chunk is larger than the whole kvd arena",
    "quota": "this connection already pins its share of the kvd arena (--client-quota)",
}


class KvdClient(Wire):
    """A connection to one kvd daemon.

    ``namespace`` scopes every key: two clients with different namespaces never see each other's
    chunks. ``model``, ``role`` and ``hash_settings`` are declared at HELLO so the daemon (and
    ``kvd stat``, ``kvd top``, ``kvd doctor``) can say who is connected and whether engines of one
    model agree on hashing. ``trust_uids`` adds uids whose daemons this client accepts (besides its
    own uid, root and ``$INFERA_KVD_TRUST_UID``): see the module docstring.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        namespace: str = "",
        name: str | None = None,
        role: str = "client",
        model: str | None = None,
        hash_settings: dict[str, Any] | None = None,
        hash_fingerprint: str | None = None,
        chunk_tokens: int | None = None,
        kv_layout: dict[str, Any] | None = None,
        want_arena: bool = True,
        timeout: float | None = 30.0,
        spin_us: int | None = None,
        trust_uids: Iterable[int] | None = None,
    ) -> None:
        super().__init__(
            os.fspath(socket_path) if socket_path is not None else default_socket_path(),
            spin_us / 1e6 if spin_us is not None else default_spin(),
        )
        self.namespace = namespace
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._populated: Populated | None = None  # what this mapping has faulted in
        self.arena_size = 0
        self.server_version = ""
        self.long_tier: str | None = None
        self.long_path: str | None = None
        self.client_id = 0
        sock = connect(self.socket_path, timeout)
        try:
            check_peer(sock, self.socket_path, trust_uids)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        hello: dict[str, Any] = {
            "op": "HELLO",
            "versions": [P.PROTOCOL_VERSION],
            "name": name or os.path.basename(sys.argv[0] or "python"),
            "pid": os.getpid(),
            "namespace": namespace,
            "role": role,
            "want_arena": want_arena,
        }
        for field, value in (
            ("model", model),
            ("hash_settings", hash_settings),
            ("hash_fingerprint", hash_fingerprint),
            ("chunk_tokens", chunk_tokens),
            ("kv_layout", kv_layout),
        ):
            if value is not None:
                hello[field] = value
        fds: list[int] = []
        try:
            reply, fds = self._call(hello, want_fds=True)
            if not reply.get("ok"):
                raise error_of(reply)
            self._accept_hello(reply, fds, want_arena)
        except BaseException:
            self.close()
            raise
        finally:
            for fd in fds:  # mapped (or refused) by now: the mapping keeps the memory alive
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _accept_hello(self, reply: dict[str, Any], fds: list[int], want_arena: bool) -> None:
        size = reply.get("arena_size")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise KvdProtocolError(f"daemon announced an arena size of {size!r}, not a positive integer")
        self.arena_size = size
        self.server_version = str(reply.get("server_version", ""))
        self.long_tier = reply.get("long_tier")
        self.long_path = reply.get("long_path")
        client_id = reply.get("client_id", 0)
        self.client_id = client_id if isinstance(client_id, int) else 0
        if want_arena:
            if not fds:
                raise KvdProtocolError("daemon did not pass the arena descriptor at HELLO")
            try:
                self._map = map_arena(fds[0], size)
            except ArenaFdError as exc:
                raise KvdArenaError(
                    f"the arena descriptor from {self.socket_path} is unusable: {exc}",
                    hint="is this a kvd daemon of this version? restart it, or check what listens there",
                ) from None
            self._view = memoryview(self._map)
            self._populated = Populated(self._map, size)

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

    def lookup(self, keys: Sequence[bytes], hold_ms: int = 0) -> int:
        """How many of ``keys`` are present, counting from the first (stops at the first miss).
        ``hold_ms`` protects the found chunks from eviction for that long."""
        if not keys:
            return 0
        reply = self.request("LOOKUP", keys=[P.check_key(k) for k in keys], hold_ms=hold_ms)
        return int(reply["count"])

    def lookup_tiers(self, keys: Sequence[bytes], hold_ms: int = 0) -> tuple[int, list[int]]:
        """:meth:`lookup`, plus the indices (into ``keys``) of the found keys that only the long
        tier holds (a load reads them from disk or the distributed store). A daemon that predates
        this says nothing about tiers: every found key then counts as a RAM one."""
        if not keys:
            return 0, []
        reply = self.request("LOOKUP", keys=[P.check_key(k) for k in keys], hold_ms=hold_ms)
        return int(reply["count"]), [int(i) for i in reply.get("long", ())]

    def delete(self, keys: Sequence[bytes]) -> int:
        if not keys:
            return 0
        return int(self.request("DELETE", keys=[P.check_key(k) for k in keys])["deleted"])

    def prewarm(self, keys: Sequence[bytes]) -> int:
        """Ask the daemon to pull these chunks from the long tier into RAM in the background."""
        return self.prewarm_rate(keys)[0]

    def prewarm_rate(self, keys: Sequence[bytes]) -> tuple[int, float | None]:
        """:meth:`prewarm`, and the GB/s the long tier's recent reads into RAM ran at (None
        until it has read anything, or from a daemon that does not say)."""
        reply = self.request("PREWARM", keys=[P.check_key(k) for k in keys])
        rate = reply.get("read_gbps")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 1e6:
            return int(reply["queued"]), None
        return int(reply["queued"]), float(rate)

    def adopt(
        self, keys: Sequence[bytes], lengths: Sequence[int], failed: Sequence[bytes] = ()
    ) -> dict[str, int]:
        """Tell the disk tier about chunk files this client wrote under its path (GPU-direct);
        ``failed`` are chunks reserved with ``persisted`` that could not be written."""
        reply = self.request(
            "ADOPT",
            keys=[P.check_key(k) for k in keys],
            lengths=list(lengths),
            failed=[P.check_key(k) for k in failed],
        )
        return {
            "adopted": int(reply.get("adopted", 0)),
            "written_through": int(reply.get("written_through", 0)),
        }

    def stats(self) -> dict[str, Any]:
        return dict(self.request("STATS")["stats"])

    def ping(self) -> bool:
        return bool(self.request("PING").get("pong"))

    def report(self, **report: Any) -> None:
        """Tell the daemon which data path this client uses, any fallback and its own counters."""
        self.notify("REPORT", report=report)

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            with contextlib.suppress(BufferError):
                view.release()
        mapped, self._map = self._map, None
        if mapped is not None:
            with contextlib.suppress(BufferError):
                mapped.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> KvdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


__all__ = [
    "TRUST_ENV",
    "KvdArenaError",
    "KvdClient",
    "KvdClientError",
    "KvdFull",
    "KvdProtocolError",
    "KvdQuota",
    "KvdRefused",
    "KvdUnavailable",
    "KvdUnsupported",
    "KvdUntrusted",
]
