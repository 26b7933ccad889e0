"""The daemon: one selector loop owning the arena, the index and every client connection.

Single-threaded on purpose: the index and policy need no locks, and a request's cost is a dict
lookup plus a small msgpack frame. Work that can block (disk and distributed tiers, the metrics
endpoint) lives in threads that hand results back through :meth:`Server.call_soon`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import selectors
import signal
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from infera import __version__
from infera.errors import KvdError
from infera.kvd import protocol as P
from infera.kvd.arena import Arena
from infera.kvd.config import DaemonConfig
from infera.kvd.store import Chunk, Store

log = logging.getLogger("infera.kvd")

_PEERCRED = struct.Struct("3i")
Reply = dict[str, Any] | None


class BadRequest(Exception):
    """A request that is well-framed but wrong; answered with a typed error, connection kept."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


class Client:
    """State of one connection. Leases and reservations die with it."""

    def __init__(self, sock: socket.socket, cid: int, pid: int, uid: int, gid: int) -> None:
        self.sock = sock
        self.id = cid
        self.peer_pid = pid
        self.uid = uid
        self.gid = gid
        self.reader: P.FrameReader | None = None
        self.out = bytearray()
        self.want_write = False
        self.hello = False
        self.info: dict[str, Any] = {}
        self.ns_id = 0
        self.namespace = ""
        self.leases: dict[int, Chunk] = {}
        self.reservations: dict[int, Chunk] = {}
        self.next_token = 1
        self.connected_at = time.time()
        self.requests = 0
        self.report: dict[str, Any] = {}
        self.closed = False

    def public(self) -> dict[str, Any]:
        info = self.info
        return {
            "id": self.id,
            "pid": info.get("pid", self.peer_pid),
            "peer_pid": self.peer_pid,
            "uid": self.uid,
            "name": info.get("name", ""),
            "role": info.get("role", ""),
            "model": info.get("model", ""),
            "namespace": self.namespace,
            "hash_settings": info.get("hash_settings", {}),
            "hash_fingerprint": info.get("hash_fingerprint", ""),
            "chunk_tokens": info.get("chunk_tokens"),
            "data_path": self.report.get("data_path", info.get("data_path", "arena")),
            "fallback": self.report.get("fallback"),
            "fallback_reason": self.report.get("fallback_reason"),
            "counters": self.report.get("counters", {}),
            "leases": len(self.leases),
            "reservations": len(self.reservations),
            "requests": self.requests,
            "connected_s": round(time.time() - self.connected_at, 1),
        }


class Server:
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
        self.snapshot_cache: dict[str, Any] = {}
        self.metrics: Any = None
        self.long: Any = None  # long tier, when configured (see infera.kvd.tiers)
        self.handlers: dict[str, Callable[[Client, dict[str, Any]], Reply]] = {
            "HELLO": self.op_hello,
            "PING": self.op_ping,
            "PUT": self.op_put,
            "SEAL": self.op_seal,
            "ABORT": self.op_abort,
            "GET": self.op_get,
            "RELEASE": self.op_release,
            "LOOKUP": self.op_lookup,
            "DELETE": self.op_delete,
            "STATS": self.op_stats,
            "PREWARM": self.op_prewarm,
            "REPORT": self.op_report,
        }

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        self._bind()
        self.arena = Arena(cfg.max_bytes)
        self.store = Store(self.arena.capacity, ephemeral_ttl=cfg.ephemeral_ttl)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        assert self.listener is not None
        self.sel.register(self.listener, selectors.EVENT_READ, ("accept", None))
        if cfg.long_backend is not None:
            from infera.kvd.tiers import open_long_tier

            self.long = open_long_tier(cfg, self)
        if cfg.metrics_port:
            from infera.kvd.metrics import MetricsServer

            self.metrics = MetricsServer(self, cfg.metrics_port)
            self.metrics.start()
        self.refresh_snapshot()
        log.info(
            "kvd %s serving on %s (arena %d bytes%s)",
            __version__,
            cfg.socket,
            self.arena.capacity,
            f", long tier {cfg.long_backend}" if cfg.long_backend else "",
        )

    def _bind(self) -> None:
        path = self.cfg.socket
        parent = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise KvdError(f"cannot create the socket directory {parent}: {exc.strerror}") from None
        lock_path = path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise KvdError(f"cannot open {lock_path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            holder = _read_pid(lock_path)
            raise KvdError(
                f"another kvd daemon is already serving {path}" + (f" (pid {holder})" if holder else ""),
                hint="stop it first, or give this one a different --socket",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        # We hold the lock, so a socket file still there is stale unless something else answers on it.
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(0.5)
                probe.connect(path)
            except OSError:
                log.info("replacing stale socket file %s", path)
                os.unlink(path)
            else:
                probe.close()
                raise KvdError(
                    f"something is already listening on {path}", hint="give this daemon a different --socket"
                )
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            raise KvdError(f"cannot bind {path}: {exc.strerror}") from None
        os.chmod(path, self.cfg.socket_mode)
        sock.listen(128)
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
        try:
            reply = handler(client, msg)
        except BadRequest as exc:
            reply = {"ok": False, "error": exc.code, "message": str(exc)}
        except Exception as exc:
            log.exception("internal error finishing a deferred request")
            reply = {"ok": False, "error": "internal", "message": f"internal error: {type(exc).__name__}"}
        if reply is not None:
            rid = msg.get("id", 0)
            reply["id"] = rid if isinstance(rid, int) else 0
            reply.setdefault("ok", True)
            self._send(client, reply)

    def serve_forever(self) -> None:
        try:
            while not self.stopping:
                for key, mask in self.sel.select(timeout=0.25):
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
                            self._flush(client)
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

    def shutdown(self) -> None:
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
                log.warning("accept failed: %s", exc)
                return
            pid, uid, gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
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
            client = Client(sock, self.next_client, pid, uid, gid)
            client.reader = P.FrameReader(self.cfg.max_frame)
            self.next_client += 1
            self.connections_total += 1
            self.clients[client.id] = client
            self.sel.register(sock, selectors.EVENT_READ, ("client", client))

    def _on_readable(self, client: Client) -> None:
        try:
            n = client.sock.recv_into(self._rbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(client, f"read error: {exc}")
            return
        if not n:
            self._drop(client, "closed by peer")
            return
        assert client.reader is not None
        try:
            frames = client.reader.feed(self._rview[:n])
        except P.FrameTooLarge as exc:
            self.protocol_errors_total += 1
            self._send(client, {"id": 0, "ok": False, "error": "too_large", "message": str(exc)})
            self._flush(client)
            self._drop(client, str(exc))
            return
        for body in frames:
            if client.closed:
                return
            self._handle_frame(client, body)

    def _handle_frame(self, client: Client, body: bytes) -> None:
        client.requests += 1
        rid: Any = 0
        msg: Any = None
        try:
            try:
                msg = P.decode_body(body)
            except Exception as exc:
                raise BadRequest(f"frame is not valid msgpack: {type(exc).__name__}") from None
            if not isinstance(msg, dict):
                raise BadRequest("a request must be a msgpack map")
            rid = msg.get("id", 0)
            op = msg.get("op")
            handler = self.handlers.get(op) if isinstance(op, str) else None
            if handler is None:
                raise BadRequest(f"unknown op {op!r}", "unknown_op")
            if not client.hello and op not in ("HELLO", "PING", "STATS"):
                raise BadRequest(f"{op} before HELLO")
            reply = handler(client, msg)
        except BadRequest as exc:
            self.protocol_errors_total += 1
            reply = {"ok": False, "error": exc.code, "message": str(exc)}
            if isinstance(msg, dict) and msg.get("noreply"):
                log.debug("dropped bad noreply request from client %d: %s", client.id, exc)
                return
        except Exception as exc:  # a bug must cost one request, never the daemon
            self.protocol_errors_total += 1
            log.exception("internal error handling a request")
            reply = {"ok": False, "error": "internal", "message": f"internal error: {type(exc).__name__}"}
        if reply is None:
            return
        reply["id"] = rid if isinstance(rid, int) else 0
        reply.setdefault("ok", True)
        fds = reply.pop("_fds", None)
        self._send(client, reply, fds)

    def _send(self, client: Client, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        frame = P.encode(msg)
        if fds:
            # Ancillary data must go out with the first byte of this frame: flush what is queued
            # first (blocking briefly), then send the frame with the descriptors attached.
            self._flush(client, block=True)
            try:
                client.sock.setblocking(True)
                sent = socket.send_fds(client.sock, [frame], fds)
                client.sock.setblocking(False)
            except OSError as exc:
                self._drop(client, f"write error: {exc}")
                return
            if sent < len(frame):
                client.out += frame[sent:]
                self._flush(client)
            return
        if client.out:
            client.out += frame
            return
        try:
            sent = client.sock.send(frame)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._drop(client, f"write error: {exc}")
            return
        if sent < len(frame):
            client.out += frame[sent:]
            self._want_write(client, True)

    def _flush(self, client: Client, block: bool = False) -> None:
        while client.out and not client.closed:
            try:
                n = client.sock.send(client.out)
            except (BlockingIOError, InterruptedError):
                if block:
                    select.select([], [client.sock], [], 0.05)
                    continue
                self._want_write(client, True)
                return
            except OSError as exc:
                self._drop(client, f"write error: {exc}")
                return
            del client.out[:n]
        self._want_write(client, False)

    def _want_write(self, client: Client, on: bool) -> None:
        if client.closed or client.want_write == on:
            return
        client.want_write = on
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
        self.sel.modify(client.sock, events, ("client", client))

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
        with contextlib.suppress(Exception):
            self.sel.unregister(client.sock)
        client.sock.close()
        self.clients.pop(client.id, None)

    # -- argument helpers -------------------------------------------------------------------
    @staticmethod
    def _keys(msg: dict[str, Any], field: str = "keys") -> list[bytes]:
        keys = msg.get(field)
        if not isinstance(keys, list):
            raise BadRequest(f"{field!r} must be a list of byte strings")
        if len(keys) > P.MAX_BATCH:
            raise BadRequest(f"at most {P.MAX_BATCH} keys per request")
        maxlen = P.MAX_KEY_LEN
        for k in keys:
            if type(k) is not bytes or not 0 < len(k) <= maxlen:
                try:
                    P.check_key(k)
                except ValueError as exc:
                    raise BadRequest(str(exc)) from None
        return keys

    @staticmethod
    def _ints(msg: dict[str, Any], field: str) -> list[int]:
        vals = msg.get(field)
        if not isinstance(vals, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in vals
        ):
            raise BadRequest(f"{field!r} must be a list of integers")
        if len(vals) > P.MAX_BATCH:
            raise BadRequest(f"at most {P.MAX_BATCH} items per request")
        return vals

    def ikeys(self, client: Client, keys: list[bytes]) -> list[bytes]:
        prefix = client.ns_id.to_bytes(2, "big")
        return [prefix + k for k in keys]

    # -- ops --------------------------------------------------------------------------------
    def op_ping(self, client: Client, msg: dict[str, Any]) -> Reply:
        return {"pong": True, "server_version": __version__}

    def op_hello(self, client: Client, msg: dict[str, Any]) -> Reply:
        assert self.store is not None and self.arena is not None
        versions = msg.get("versions", [P.PROTOCOL_VERSION])
        if not isinstance(versions, list) or not all(isinstance(v, int) for v in versions):
            raise BadRequest("'versions' must be a list of integers")
        common = sorted(set(versions) & set(range(P.MIN_PROTOCOL_VERSION, P.PROTOCOL_VERSION + 1)))
        if not common:
            raise BadRequest(
                f"no common protocol version: client speaks {versions}, daemon speaks "
                f"{P.MIN_PROTOCOL_VERSION}..{P.PROTOCOL_VERSION}",
                "version",
            )
        namespace = msg.get("namespace", "")
        if not isinstance(namespace, str) or len(namespace) > 1024:
            raise BadRequest("'namespace' must be a string of at most 1024 characters")
        info: dict[str, Any] = {}
        for field, typ in (
            ("name", str),
            ("pid", int),
            ("role", str),
            ("model", str),
            ("hash_settings", dict),
            ("hash_fingerprint", str),
            ("chunk_tokens", int),
            ("data_path", str),
        ):
            value = msg.get(field)
            if value is not None:
                if not isinstance(value, typ):
                    raise BadRequest(f"{field!r} must be a {typ.__name__}")
                info[field] = value
        client.info = info
        client.namespace = namespace
        try:
            client.ns_id = self.store.ns_id(namespace)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        client.hello = True
        reply: dict[str, Any] = {
            "version": common[-1],
            "server_version": __version__,
            "client_id": client.id,
            "arena_size": self.arena.capacity,
            "long_tier": self.cfg.long_backend,
        }
        if msg.get("want_arena", True):
            reply["arena_fd"] = True
            reply["_fds"] = [self.arena.fd]
        return reply

    def op_put(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        keys = self._keys(msg)
        lengths = self._ints(msg, "lengths")
        if len(lengths) != len(keys):
            raise BadRequest("'keys' and 'lengths' must have the same length")
        retention = msg.get("retention", "long")
        if retention not in P.RETENTION_CODE:
            raise BadRequest(f"retention must be one of {', '.join(P.RETENTIONS)}")
        code = P.RETENTION_CODE[retention]
        overwrite = bool(msg.get("overwrite", False))
        slots: list[Any] = []
        for ikey, length in zip(self.ikeys(client, keys), lengths, strict=True):
            if length < 0:
                raise BadRequest("lengths must not be negative")
            res = store.reserve(ikey, length, code, overwrite)
            if res.chunk is None:
                slots.append(res.error)
                continue
            token = client.next_token
            client.next_token += 1
            client.reservations[token] = res.chunk
            slots.append([token, res.chunk.offset])
        return {"slots": slots}

    def op_seal(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        tokens = self._ints(msg, "tokens")
        sealed = 0
        for token in tokens:
            chunk = client.reservations.pop(token, None)
            if chunk is None:
                continue
            if store.seal(chunk):
                sealed += 1
        if msg.get("noreply"):
            return None
        return {"sealed": sealed}

    def op_abort(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        n = 0
        for token in self._ints(msg, "tokens"):
            chunk = client.reservations.pop(token, None)
            if chunk is not None:
                store.abort(chunk)
                n += 1
        return None if msg.get("noreply") else {"aborted": n}

    def op_get(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        keys = self._keys(msg)
        ikeys = self.ikeys(client, keys)
        fetch = getattr(self.long, "fetch", None)
        if fetch is not None and not msg.get("_resumed"):
            # RAM misses the long tier holds are read into the arena by its threads; the reply
            # waits for them (see resume), the loop does not.
            index = store.index
            if any(k not in index for k in ikeys) and fetch(
                ikeys, lambda: self.resume(client, msg, self.op_get)
            ):
                return None
        items: list[Any] = []
        hits = 0
        for ikey in ikeys:
            chunk = store.find(ikey)
            if chunk is None and self.long is not None:
                chunk = self.long.promote(ikey)
            if chunk is None:
                items.append(None)
                continue
            store.lease(chunk)
            token = client.next_token
            client.next_token += 1
            client.leases[token] = chunk
            items.append([token, chunk.offset, chunk.length])
            hits += 1
        c = store.c
        c["gets_total"] += len(keys)
        c["hits_total"] += hits
        c["misses_total"] += len(keys) - hits
        if self.long is not None:
            self.long.count_get(len(keys), hits)
        return {"items": items}

    def op_release(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        n = 0
        for token in self._ints(msg, "leases"):
            chunk = client.leases.pop(token, None)
            if chunk is not None:
                store.release(chunk)
                n += 1
        return None if msg.get("noreply") else {"released": n}

    def op_lookup(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        keys = self._keys(msg)
        hold = msg.get("hold_ms", 0)
        if not isinstance(hold, int | float) or hold < 0 or hold > 600_000:
            raise BadRequest("'hold_ms' must be a number between 0 and 600000")
        ikeys = self.ikeys(client, keys)
        count, _ = store.count_present(ikeys, hold / 1000.0)
        if count < len(ikeys) and self.long is not None:
            # the rest may be on the long tier (a RAM miss in the middle continues there)
            for ikey in ikeys[count:]:
                chunk = store.find(ikey)
                if chunk is not None:
                    store.touch(chunk)
                    if hold:
                        store.hold(chunk, hold / 1000.0)
                elif not self.long.contains(ikey):
                    break
                count += 1
        c = store.c
        c["lookups_total"] += 1
        c["lookup_keys_total"] += len(keys)
        c["lookup_hit_keys_total"] += count
        reply: dict[str, Any] = {"count": count}
        if self.long is not None and self.long.loading:
            reply["loading"] = True
        return reply

    def op_delete(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.store
        assert store is not None
        ikeys = self.ikeys(client, self._keys(msg))
        n = store.delete(ikeys)
        if self.long is not None:
            n = max(n, self.long.delete(ikeys))
        return {"deleted": n}

    def op_prewarm(self, client: Client, msg: dict[str, Any]) -> Reply:
        keys = self._keys(msg)
        if self.long is None:
            raise BadRequest(
                "PREWARM needs a long tier: start the daemon with --long-path/--long-bytes", "unsupported"
            )
        queued = self.long.prewarm(self.ikeys(client, keys))
        return {"queued": queued}

    def op_report(self, client: Client, msg: dict[str, Any]) -> Reply:
        report = msg.get("report")
        if not isinstance(report, dict):
            raise BadRequest("'report' must be a map")
        counters = report.get("counters", {})
        if not isinstance(counters, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) for k, v in counters.items()
        ):
            raise BadRequest("'report.counters' must map names to numbers")
        clean: dict[str, Any] = {"counters": counters}
        for field in ("data_path", "fallback_reason", "requested_path"):
            value = report.get(field)
            if value is not None:
                if not isinstance(value, str):
                    raise BadRequest(f"'report.{field}' must be a string")
                clean[field] = value[:500]
        clean["fallback"] = bool(report.get("fallback", False))
        if clean["fallback"] and not client.report.get("fallback"):
            log.warning(
                "client %d (%s, pid %s) fell back to %s: %s",
                client.id,
                client.info.get("name", "?"),
                client.info.get("pid", client.peer_pid),
                clean.get("data_path", "?"),
                clean.get("fallback_reason", "no reason given"),
            )
        client.report = clean
        return None if msg.get("noreply") else {}

    def op_stats(self, client: Client, msg: dict[str, Any]) -> Reply:
        self.refresh_snapshot()
        return {"stats": self.snapshot_cache}

    # -- stats ------------------------------------------------------------------------------
    def refresh_snapshot(self) -> None:
        if self.store is None:
            return
        snap = self.store.snapshot()
        clients = [c.public() for c in self.clients.values() if c.hello]
        snap.update(
            {
                "version": __version__,
                "protocol": P.PROTOCOL_VERSION,
                "pid": os.getpid(),
                "socket": self.cfg.socket,
                "uptime_s": round(time.time() - self.started, 1),
                "connections_total": self.connections_total,
                "refused_total": self.refused_total,
                "protocol_errors_total": self.protocol_errors_total,
                "clients_connected": len(clients),
                "clients": clients,
                "namespaces": sorted({c["namespace"] for c in clients}),
                "long_backend": self.cfg.long_backend,
                "warnings": hash_warnings(clients),
            }
        )
        tiers: dict[str, Any] = {
            "ram": {
                "hits": snap["hits_total"],
                "misses": snap["misses_total"],
                "bytes_read": snap["bytes_out_total"],
                "bytes_written": snap["bytes_in_total"],
                "chunks": snap["chunks"],
                "bytes_used": snap["arena_bytes_used"],
                "capacity": snap["arena_bytes_capacity"],
                "evictions": snap["evictions_total"],
            }
        }
        if self.long is not None:
            tiers["long"] = self.long.stats()
        snap["tiers"] = tiers
        self.snapshot_cache = snap


def hash_warnings(clients: list[dict[str, Any]]) -> list[str]:
    """Warn when clients serving the same model declare different hash settings (their keys never meet)."""
    by_model: dict[str, dict[str, list[str]]] = {}
    for c in clients:
        model = c.get("model")
        fp = c.get("hash_fingerprint")
        if not model or not fp:
            continue
        by_model.setdefault(model, {}).setdefault(fp, []).append(f"pid {c.get('pid')}")
    out = []
    for model, fps in sorted(by_model.items()):
        if len(fps) > 1:
            parts = "; ".join(f"{fp}: {', '.join(pids)}" for fp, pids in sorted(fps.items()))
            out.append(
                f"engines of model {model} disagree on hash settings, so they never share chunks ({parts})"
            )
    return out


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


__all__ = ["Server", "hash_warnings"]
