"""A connection to the kvd daemon that degrades instead of failing, and comes back by itself.

The engine must keep serving when the daemon is down, restarting, or was never started: every
call site asks :meth:`DaemonLink.client` for a connected client and treats None as "no cache
right now" (a miss, a skipped save). A lost connection is logged once, counted, and so are an
outage and the reconnect.

Reconnecting is a background thread's job (one daemon thread per link, gone at :meth:`close`).
While connected it sleeps in ``poll()`` on the connection, which wakes it only when the daemon
hangs up (a restart, a crash): no timer, no traffic. While disconnected it tries again every
``retry_every_s`` (0.25 s; a daemon that answers but refuses backs off up to ``retry_max_s``),
so the first request after the daemon is back finds a connection, and the daemon's client list
(``kvd stat``) shows this engine again at once: the new connection sends the same HELLO (name,
role, model, namespace, hash settings). Requests never wait for the thread's attempts: while one
runs, :meth:`client` answers None. A request may try once itself when the daemon has bound its
socket anew since the last failed attempt (one ``stat``), so a request that comes between a
restart and the thread's next tick does not miss either. The owner of an arena mapping (a
worker) brackets its use of the client with :meth:`using`, so that the thread's connect and
disconnect hooks never run while a step copies to or from the arena.

The watcher polls a duplicate of the client's socket descriptor (``KvdClient._sock``); if a
client has none, a hang-up is found by the next call instead, as before.

``watch=False`` leaves reconnecting to the calls, on a backoff of ``retry_initial_s`` doubling up
to ``retry_max_s`` (how the link worked before it had the thread).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from infera.engine.vllm.keys import Namespace
from infera.engine.vllm.link_watch import watch
from infera.kvd.client import KvdClient, KvdClientError, KvdRefused, KvdUnavailable

log = logging.getLogger("infera.engine.vllm")
T = TypeVar("T")


class DaemonLink:
    """Connects at the first :meth:`client` call, then keeps connected; ``client()`` never raises."""

    def __init__(
        self,
        socket_path: str,
        namespace: Namespace,
        *,
        role: str,
        name: str,
        model: str,
        want_arena: bool,
        kv_layout: dict[str, Any] | None = None,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 15.0,
        retry_every_s: float = 0.25,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_connect: Callable[[KvdClient], None] | None = None,
        on_disconnect: Callable[[KvdClient], None] | None = None,
        watch: bool = True,
        spin_us: int | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.spin_us = spin_us  # INFERA_KVD_SPIN_US as the connector parsed it (None: the client's own)
        self.namespace = namespace
        self.role = role
        self.name = name
        self.model = model
        self.want_arena = want_arena
        self.kv_layout = kv_layout
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.retry_every_s = retry_every_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.watch = watch
        self._client: KvdClient | None = None
        self._next_try = 0.0
        self._first_backoff = retry_every_s if watch else retry_initial_s
        self._backoff = self._first_backoff
        self._down_since: float | None = None
        self._lost_at: float | None = None
        self._attempt = threading.Lock()  # one connect attempt at a time
        self._lock = threading.Lock()  # the connection state
        self._use = threading.RLock()  # held by the owner while it uses the client (see using())
        self._failed_socket: tuple[int, int, int] | None = None  # the socket file a failed try saw
        self._closed = False
        self._watcher: threading.Thread | None = None
        self._wake: socket.socket | None = None  # our end of the watcher's wake-up pair
        self.wakeups = 0  # times the watcher woke (tests check it sleeps while connected)
        self.counters: dict[str, int] = {"connects": 0, "connect_failures": 0, "outages": 0, "disconnects": 0}
        self.last_error = ""

    @property
    def connected(self) -> bool:
        return self._client is not None

    def client(self) -> KvdClient | None:
        """The connected client, or None while the daemon is unreachable or a connect attempt
        is under way elsewhere. Tries to connect itself when the retry schedule says so, or when
        a daemon (re)created the socket since the last failed attempt; never waits for the
        watcher's attempt (lock order: attempt, use, state)."""
        client = self._client
        if client is not None:
            return client
        if self._closed or not self._due():
            return None
        if not self._attempt.acquire(blocking=False):
            return None  # the watcher is connecting right now
        try:
            return self._connect()
        finally:
            self._attempt.release()

    @contextlib.contextmanager
    def using(self, wait: bool = False) -> Iterator[bool]:
        """Bracket a use of the client and its arena mapping (a worker's load or save): the
        watcher's connect and disconnect hooks wait until it ends. Yields False, without waiting
        unless ``wait``, while the watcher is (dis)connecting: treat the daemon as unavailable."""
        if not self._use.acquire(blocking=wait):
            yield False
            return
        try:
            yield True
        finally:
            self._use.release()

    def call(self, fn: Callable[[KvdClient], T]) -> T:
        """Run ``fn`` on the client; a connection found dead is reopened and ``fn`` tried once more
        (a restarted daemon costs no miss). Raises KvdUnavailable when there is no daemon."""
        for _attempt in range(2):
            client = self.client()
            if client is None:
                break
            try:
                return fn(client)
            except KvdUnavailable as exc:
                self.failed(exc, client)
        raise KvdUnavailable(f"kvd at {self.socket_path} is unreachable: {self.last_error}")

    def failed(self, exc: BaseException, client: KvdClient | None = None) -> None:
        """Report that a call on ``client`` (default: the current one) failed: drop it and
        reconnect. A client already replaced (the watcher saw the hang-up first) is left alone."""
        with self._lock:
            current = self._client
            if current is None or (client is not None and client is not current):
                return
            self._client = None
            self._closing(current)
            self._note_failure(exc, connecting=False)
        self._kick()

    # -- connecting --------------------------------------------------------------------------
    def _due(self) -> bool:
        return self.clock() >= self._next_try or _socket_id(self.socket_path) != self._failed_socket

    def _connect(self) -> KvdClient | None:
        """One connect attempt (``_attempt`` held): HELLO outside the other locks, then the
        owner's hook and the new client published together; wakes the watcher."""
        if self._client is not None or self._closed:
            return self._client
        seen = _socket_id(self.socket_path)
        try:
            client = KvdClient(
                self.socket_path,
                namespace=self.namespace.name,
                name=self.name,
                role=self.role,
                model=self.model,
                hash_settings=self.namespace.hash_settings,
                hash_fingerprint=self.namespace.hash_fingerprint,
                chunk_tokens=self.namespace.chunk_tokens,
                kv_layout=self.kv_layout,
                want_arena=self.want_arena,
                timeout=self.timeout_s,
                spin_us=self.spin_us,
            )
        except KvdClientError as exc:
            with self._lock:
                self._failed_socket = seen
                self._note_failure(exc, connecting=True)
            return None
        with self._use, self._lock:
            if self._closed or self._client is not None:  # closed (or connected) meanwhile
                client.close()
                return self._client
            if self.on_connect is not None:
                try:
                    self.on_connect(client)
                except Exception as exc:
                    client.close()
                    self._failed_socket = seen
                    self._note_failure(exc, connecting=True)
                    return None
            self.counters["connects"] += 1
            if self._down_since is not None:
                log.info(
                    "infera-kvd %s: reconnected to %s after %.1f s; offload is back",
                    self.role,
                    self.socket_path,
                    self.clock() - self._down_since,
                )
            elif self._lost_at is not None:
                log.info("infera-kvd %s: reconnected to %s", self.role, self.socket_path)
            self._down_since = None
            self._lost_at = None
            self._backoff = self._first_backoff
            self._client = client
            self._start_watcher()
        self._kick()
        return client

    def _note_failure(self, exc: BaseException, connecting: bool) -> None:
        now = self.clock()
        # log the text, not the exception: a kept log record would keep its traceback's frames
        self.last_error = why = str(exc)
        if not connecting:
            # An established connection died (often a daemon restart): reopen at once, and only
            # call it an outage if that fails.
            self.counters["disconnects"] += 1
            log.info(
                "infera-kvd %s: connection to %s lost (%s); reconnecting", self.role, self.socket_path, why
            )
            self._lost_at = now
            self._next_try = now
            return
        self.counters["connect_failures"] += 1
        if self._down_since is None:
            self._down_since = self._lost_at if self._lost_at is not None else now
            self.counters["outages"] += 1
            hint = " (this uid is not allowed)" if isinstance(exc, KvdRefused) else ""
            how = (
                f"retrying every {self.retry_every_s:g} s in the background"
                if self.watch
                else "retrying as requests come"
            )
            log.warning(
                "infera-kvd %s: daemon at %s unreachable%s: %s; serving by recompute, %s",
                self.role,
                self.socket_path,
                hint,
                why,
                how,
            )
            delay = self._backoff
        else:
            log.debug("infera-kvd: daemon still unreachable: %s", why)
            if self.watch and isinstance(exc, KvdUnavailable):
                delay = self.retry_every_s  # nothing listening: cheap to ask again, soon
            else:  # a daemon that answers but refuses (or a hook that fails) will not change soon
                self._backoff = min(self._backoff * 2, self.retry_max_s)
                delay = self._backoff
        self._next_try = now + delay
        self._start_watcher()

    # -- the watcher thread ------------------------------------------------------------------
    def _start_watcher(self) -> None:
        if not self.watch or self._closed or (self._watcher is not None and self._watcher.is_alive()):
            return
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        if self._wake is not None:
            self._wake.close()
        self._wake = ours
        self._watcher = threading.Thread(
            target=watch, args=(weakref.ref(self), theirs), name=f"kvd-link-{self.role}", daemon=True
        )
        self._watcher.start()

    def _kick(self) -> None:
        """Wake the watcher: the connection changed, or the link closes."""
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(OSError):
                wake.send(b"\0")

    def _watch_state(self) -> tuple[KvdClient | None, float | None] | None:
        """For the watcher: None to stop; else (the client to watch, or None and the seconds
        until the next connect attempt is due)."""
        if self._closed:
            return None
        client = self._client
        if client is not None:
            return client, None
        return None, max(0.0, self._next_try - self.clock())

    def _hung_up(self, client: KvdClient) -> None:
        """The watcher saw the daemon close ``client``'s connection."""
        with self._use, self._lock:
            if self._client is not client or self._closed:
                return
            self._client = None
            self._closing(client)
            self._note_failure(KvdUnavailable(f"kvd at {self.socket_path} closed the connection"), False)

    def _retry(self) -> None:
        """The watcher's connect attempt, when one is due."""
        with self._attempt:
            if self._client is None and not self._closed and self.clock() >= self._next_try:
                self._connect()

    # -- the rest ----------------------------------------------------------------------------
    def report(self, **fields: Any) -> None:
        client = self._client
        if client is None:
            return
        try:
            client.report(**fields)
        except KvdClientError as exc:
            self.failed(exc, client)

    def _closing(self, client: KvdClient) -> None:
        """Let the owner finish with the client's arena mapping (GPU copies in flight), then close."""
        if self.on_disconnect is not None:
            try:
                self.on_disconnect(client)
            except Exception:
                log.exception("infera-kvd %s: cleanup before closing the connection failed", self.role)
        client.close()

    def close(self) -> None:
        """Disconnect and stop the watcher (waits for an attempt it is making, at most timeout_s)."""
        self._closed = True
        self._kick()
        with self._use, self._lock:
            client, self._client = self._client, None
            if client is not None:
                self._closing(client)
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=1.0)
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.close()


def _socket_id(path: str) -> tuple[int, int, int] | None:
    """Which socket file is at ``path`` (a restarted daemon binds a new one), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns
