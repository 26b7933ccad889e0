"""``KvdClient``: the library engines, tools and users' scripts use to talk to a kvd daemon.

Reads and writes go through the shared arena: a ``put`` reserves a region, copies the bytes into
the mapped arena and seals it; a ``get`` leases a region, copies it out and releases the lease
(the release rides along without waiting for a reply, so a read costs one round trip). Each
region reserved or leased is first populated in this client's mapping (:mod:`infera.kvd.populate`).
The client is thread-safe (one lock around each request) and raises only ``KvdClientError``s.

Connecting, and what the client checks before it trusts a daemon: :mod:`infera.kvd.clientnet`;
the reads and writes through the arena: :mod:`infera.kvd.clientarena`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from infera.kvd import protocol as P
from infera.kvd.clientarena import ArenaIO
from infera.kvd.clientarena import Buffer as Buffer
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
from infera.kvd.protocol import default_socket_path


class KvdClient(ArenaIO):
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
                raise error_of(reply, "HELLO")
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
        self.greeted = True
        self.server_version = str(reply.get("server_version", ""))
        self.long_tier = reply.get("long_tier")
        self.long_path = reply.get("long_path")
        client_id = reply.get("client_id", 0)
        self.client_id = client_id if isinstance(client_id, int) else 0
        if want_arena:
            if not fds:
                raise KvdProtocolError("daemon did not pass the arena descriptor at HELLO")
            self._map_arena(fds[0], size)

    # -- public API (put, get and the low-level region calls: ArenaIO) ----------------------
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

    def hold(self, keys: Sequence[bytes], hold_ms: int) -> tuple[int, int]:
        """:meth:`lookup` with a hold of ``hold_ms``: how many keys are present (from the first),
        and how many of those leading ones the daemon holds for this connection. It may hold
        fewer: what a connection keeps from eviction is bounded (the daemon's ``--client-quota``).
        A daemon that predates the bound holds them all."""
        if not keys:
            return 0, 0
        reply = self.request("LOOKUP", keys=[P.check_key(k) for k in keys], hold_ms=hold_ms)
        count = int(reply["count"])
        return count, int(reply.get("held", count))

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
        stats = self.request("STATS").get("stats")
        if not isinstance(stats, dict):
            raise KvdProtocolError(
                f"the daemon's STATS reply holds no stats map (got {type(stats).__name__})"
            )
        return dict(stats)

    def ping(self) -> bool:
        return bool(self.request("PING").get("pong"))

    def report(self, **report: Any) -> None:
        """Tell the daemon which data path this client uses, any fallback and its own counters."""
        self.notify("REPORT", report=report)

    def close(self) -> None:
        self._unmap()
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
