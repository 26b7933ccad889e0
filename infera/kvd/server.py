"""The daemon: one selector loop owning the arena, the index and every client connection.

Single-threaded on purpose: the index and policy need no locks, and a request's cost is a dict
lookup plus a small msgpack frame. Work that can block (disk and distributed tiers, the metrics
endpoint) lives in threads that hand results back through :meth:`Server.call_soon`. The loop itself
never blocks on a client: connection I/O and its bounds live in :mod:`infera.kvd.netio` (replies:
:mod:`infera.kvd.netout`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera import __version__
from infera.errors import KvdError
from infera.kvd import protocol as P
from infera.kvd.arena import Arena, open_arena
from infera.kvd.config import DaemonConfig
from infera.kvd.conn import BadRequest, Client, Reply
from infera.kvd.netio import NetIO
from infera.kvd.netout import NetOut
from infera.kvd.ops import Ops
from infera.kvd.paths import acquire_lock, clear_stale_socket, prepare_socket_dir
from infera.kvd.slices import Sliced, SliceRunner, spec_for
from infera.kvd.snapshot import build_snapshot, hash_warnings
from infera.kvd.store import Store
from infera.units import format_size

if TYPE_CHECKING:
    from infera.kvd.tiers.base import LongTier

log = logging.getLogger("infera.kvd")

LISTEN_BACKLOG = max(socket.SOMAXCONN, 4096)  # pending connects; the kernel caps it at net.core.somaxconn
# Ops that may leave state keyed by the client's namespace id (see infera.kvd.namespaces): in RAM
# only a PUT creates chunks; a long tier also remembers the ids that GET, LOOKUP, ... asked about.
_NS_KEYING_OPS = frozenset(("PUT",))
_NS_KEYING_OPS_LONG = frozenset(("PUT", "GET", "LOOKUP", "DELETE", "PREWARM", "ADOPT"))


class Server(NetIO, NetOut, Ops, SliceRunner):
    """The kvd daemon. ``start()`` binds and allocates; ``serve_forever()`` runs the loop."""

    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.sel = selectors.DefaultSelector()
        self.clients: dict[int, Client] = {}
        self.next_client = 1
        self.connections_total = 0
        self.refused_total = 0
        self.protocol_errors_total = 0
        self.started = time.time()
        self.stopping = False
        self.arena: Arena | None = None
        self.store: Store | None = None
        self.listener: socket.socket | None = None
        self._lock_fd: int | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._soon: deque[Callable[[], None]] = deque()
        self._rbuf = bytearray(256 << 10)
        self._rview = memoryview(self._rbuf)
        self._last_tick = 0.0
        self._init_netio()
        self._ns_keying = _NS_KEYING_OPS
        self.snapshot_cache: dict[str, Any] = {}
        self.metrics: Any = None
        self.long: LongTier | None = None  # long tier, when configured (see infera.kvd.tiers)
        # one handler per op of the protocol's table, named op_<op>: the table is the only list
        self.handlers: dict[str, Callable[[Client, dict[str, Any]], Reply]] = {
            op: getattr(self, f"op_{op.lower()}") for op in P.OPS
        }

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        self._bind()
        self.arena = open_arena(cfg.max_bytes)
        self.store = Store(self.arena.capacity, ephemeral_ttl=cfg.ephemeral_ttl)
        if cfg.prefault:
            self.arena.prefault_in_background()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        assert self.listener is not None
        self.sel.register(self.listener, selectors.EVENT_READ, ("accept", None))
        if cfg.long_backend is not None:
            from infera.kvd.tiers import open_long_tier
            from infera.kvd.tiers.base import Host

            self.long = open_long_tier(cfg, Host(self.store, self.arena, self.call_soon))
            self.store.ns.reclaimable_used = False  # the tier remembers ids (infera.kvd.namespaces)
            self._ns_keying = _NS_KEYING_OPS_LONG
        if cfg.metrics_port:
            from infera.kvd.metrics import MetricsServer

            self.metrics = MetricsServer(self, cfg.metrics_port)
            self.metrics.start()
        self.refresh_snapshot()
        log.info(
            "kvd %s serving on %s (arena %s%s)",
            __version__,
            cfg.socket,
            format_size(self.arena.capacity),
            f", long tier {cfg.long_backend}" if cfg.long_backend else "",
        )

    def _bind(self) -> None:
        path = self.cfg.socket
        prepare_socket_dir(path, shared=self.cfg.allow_any_uid or bool(self.cfg.allow_uids))
        self._lock_fd = acquire_lock(path + ".lock", path)
        # We hold the lock, so a socket file still there is stale unless something else answers on it.
        clear_stale_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            raise KvdError(f"cannot bind {path}: {exc.strerror or exc}") from None
        os.chmod(path, self.cfg.socket_mode)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        self.listener = sock

    def install_signal_handlers(self) -> None:
        assert self._wake_w is not None
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

        def _stop(signum: int, _frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread (safe to call from any thread)."""
        self._soon.append(fn)
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    def resume(
        self, client: Client, msg: dict[str, Any], handler: Callable[[Client, dict[str, Any]], Reply]
    ) -> None:
        """Answer a request whose handler returned None to wait for a tier (loop thread only):
        run the handler again with ``_resumed`` set and send its reply, unless the client left."""
        if client.closed:
            return
        msg["_resumed"] = True
        job = msg.get("_sliced")
        if isinstance(job, Sliced):  # one slice of a big request (infera.kvd.slices): on from here
            self._slice_step(client, job, lambda: handler(client, msg))
            return
        self._answer(client, msg, lambda: handler(client, msg))

    def _answer(self, client: Client, msg: Any, run: Callable[[], Reply]) -> None:
        """Run one handler; turn BadRequest and bugs into typed error replies; send the reply."""
        try:
            reply = run()
        except BadRequest as exc:
            self.protocol_errors_total += 1
            if isinstance(msg, dict) and msg.get("noreply"):
                log.debug("dropped bad noreply request from client %d: %s", client.id, exc)
                return
            reply = {"ok": False, "error": exc.code, "message": str(exc)}
        except Exception as exc:  # a bug must cost one request, never the daemon
            self.protocol_errors_total += 1
            log.exception("internal error handling a request")
            reply = {"ok": False, "error": "internal", "message": f"internal error: {type(exc).__name__}"}
        if reply is None:
            return
        rid = msg.get("id", 0) if isinstance(msg, dict) else 0
        reply["id"] = rid if type(rid) is int else 0  # a bool is an int to isinstance
        reply.setdefault("ok", True)
        fds = reply.pop("_fds", None)
        self._send(client, reply, fds)

    def serve_forever(self) -> None:
        spin = self.cfg.busy_poll_us / 1e6
        gate = self.net.spin_gate
        last_event = 0.0
        try:
            while not self.stopping:
                # frames waiting for their turn and the accept back-off shorten the sleep
                idle = self._io_turn() if self._ready or self._accept_resume_at else 0.25
                # Right after traffic, poll instead of sleeping for a short window: a request
                # that follows within it is seen at once, without waking an idle CPU (tens of
                # microseconds on virtual machines), but only while the host has a CPU to spare
                # for it (infera.kvd.spin). --busy-poll-us 0 turns this off.
                now = time.monotonic()
                timeout = 0.0 if spin and now - last_event < spin and gate.may_poll(now) else idle
                events = self.sel.select(timeout=timeout)
                if events:
                    last_event = time.monotonic()
                for key, mask in events:
                    kind, client = key.data
                    if kind == "accept":
                        self._accept()
                    elif kind == "wake":
                        with contextlib.suppress(OSError):
                            while self._wake_r is not None and self._wake_r.recv(4096):
                                pass
                    else:
                        if mask & selectors.EVENT_READ:
                            self._on_readable(client)
                        if mask & selectors.EVENT_WRITE and not client.closed:
                            self._on_writable(client)
                while self._soon:
                    self._soon.popleft()()
                now = time.monotonic()
                if now - self._last_tick >= 1.0:
                    self._last_tick = now
                    self._tick()
        finally:
            self.shutdown()

    def _tick(self) -> None:
        assert self.store is not None
        self.store.sweep()
        if self.long is not None:
            self.long.tick()
        self.refresh_snapshot()

    def shutdown(self, started: bool = True) -> None:
        """Drop every client, stop the long tier and metrics, remove the socket and lock, unmap the
        arena. ``started=False``: undoing a start that failed (nothing was served: no log line)."""
        if started:
            log.info("shutting down")
        for client in list(self.clients.values()):
            self._drop(client, "daemon shutting down")
        if self.long is not None:
            with contextlib.suppress(Exception):
                self.long.close()
        if self.metrics is not None:
            self.metrics.stop()
        if self.listener is not None:
            with contextlib.suppress(Exception):
                self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                os.unlink(self.cfg.socket)
        self.net.spin_gate.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
            with contextlib.suppress(OSError):
                os.unlink(self.cfg.socket + ".lock")
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    # -- connections ------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._accept_failed(exc)  # EMFILE and co.: rest the listener (netio)
                return
            self._accepted()
            pid, uid, gid = P.peer_cred(sock)
            if not self.cfg.allowed(uid):
                self.refused_total += 1
                log.warning("refused connection from pid %d uid %d: uid not allowed", pid, uid)
                with contextlib.suppress(OSError):
                    sock.setblocking(True)
                    sock.settimeout(0.2)
                    sock.sendall(
                        P.encode(
                            {
                                "id": 0,
                                "ok": False,
                                "error": "refused",
                                "message": f"uid {uid} is not allowed to use this kvd daemon",
                            }
                        )
                    )
                sock.close()
                continue
            sock.setblocking(False)
            client = Client(sock, self.next_client, pid, uid, gid, self.client_quota())
            client.reader = P.FrameReader(self.cfg.max_frame)
            self.next_client += 1
            self.connections_total += 1
            self.clients[client.id] = client
            self._interest(client)  # registers it for reading

    def client_quota(self) -> int | None:
        """The bytes one connection may pin (``--client-quota``, a share of the arena; None: 100 %)."""
        assert self.arena is not None
        share = self.cfg.client_quota
        return None if share >= 100 else self.arena.capacity * share // 100

    def _handle_frame(self, client: Client, body: bytes) -> None:
        client.requests += 1
        try:
            # small bodies cannot amplify memory: decoded as ever; big ones within a budget
            msg = P.decode_body(body) if len(body) <= P.CHECKED_BODY else self.net.decoder.decode(body)
        except P.RequestTooComplex as exc:
            msg, error = None, str(exc)
        except Exception as exc:
            msg = None
            error = f"frame is not valid msgpack: {type(exc).__name__}"
        else:
            error = "" if isinstance(msg, dict) else "a request must be a msgpack map"
            # a batch bigger than one slice is handled over several turns (infera.kvd.slices)
            spec = spec_for(msg) if not error and client.hello else None
            if spec is not None:
                self._start_sliced(client, msg, spec)
                return
        self._answer(client, msg, lambda: self._dispatch(client, msg, error))

    def _dispatch(self, client: Client, msg: Any, error: str) -> Reply:
        if error:
            raise BadRequest(error)
        op = msg.get("op")
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            raise BadRequest(f"unknown op {op!r}", "unknown_op")
        if not client.hello and op not in ("HELLO", "PING", "STATS"):
            raise BadRequest(f"{op} before HELLO")
        if not client.ns_used and op in self._ns_keying:
            client.ns_used = True  # its namespace id may now key chunks or long-tier state
            assert self.store is not None
            self.store.ns.mark_used(client.ns_id)
        return handler(client, msg)

    def _drop(self, client: Client, why: str) -> None:
        if client.closed:
            return
        client.closed = True
        store = self.store
        assert store is not None
        for chunk in client.leases.values():
            store.release(chunk)
        for chunk in client.reservations.values():
            store.abort(chunk)
        if client.leases or client.reservations:
            log.info(
                "client %d (pid %s) gone (%s): returned %d leases and %d reservations",
                client.id,
                client.info.get("pid", client.peer_pid),
                why,
                len(client.leases),
                len(client.reservations),
            )
        client.leases.clear()
        client.reservations.clear()
        client.budget.clear()
        if client.hello:
            store.ns.release(client.ns_id)
        self._forget_io(client)
        with contextlib.suppress(Exception):
            self.sel.unregister(client.sock)
        client.sock.close()
        self.clients.pop(client.id, None)

    # -- stats ------------------------------------------------------------------------------
    def refresh_snapshot(self) -> None:
        if self.store is not None:
            self.snapshot_cache = build_snapshot(self)


__all__ = ["Server", "hash_warnings"]
