"""A connection to the kvd daemon that degrades instead of failing.

The engine must keep serving when the daemon is down, restarting, or was never started: every
call site asks :meth:`DaemonLink.client` for a connected client and treats None as "no cache
right now" (a miss, a skipped save). A lost connection is logged once per outage, counted, and
retried with exponential backoff; the reconnect is logged too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from infera.engine.vllm.keys import Namespace
from infera.kvd.client import KvdClient, KvdClientError, KvdRefused, KvdUnavailable

log = logging.getLogger("infera.engine.vllm")
T = TypeVar("T")


class DaemonLink:
    """Lazily (re)connects; ``client()`` never raises."""

    def __init__(
        self,
        socket_path: str,
        namespace: Namespace,
        *,
        role: str,
        name: str,
        model: str,
        want_arena: bool,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 15.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_connect: Callable[[KvdClient], None] | None = None,
        on_disconnect: Callable[[KvdClient], None] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.namespace = namespace
        self.role = role
        self.name = name
        self.model = model
        self.want_arena = want_arena
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self._client: KvdClient | None = None
        self._next_try = 0.0
        self._backoff = retry_initial_s
        self._down_since: float | None = None
        self._lost_at: float | None = None
        self._lock = threading.Lock()
        self.counters: dict[str, int] = {"connects": 0, "connect_failures": 0, "outages": 0, "disconnects": 0}
        self.last_error = ""

    @property
    def connected(self) -> bool:
        return self._client is not None

    def client(self) -> KvdClient | None:
        """The connected client, or None while the daemon is unreachable (retries on backoff)."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is not None:
                return self._client
            now = self.clock()
            if now < self._next_try:
                return None
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
                    want_arena=self.want_arena,
                    timeout=self.timeout_s,
                )
            except KvdClientError as exc:
                self._note_failure(exc, connecting=True)
                return None
            if self.on_connect is not None:
                try:
                    self.on_connect(client)
                except Exception as exc:
                    client.close()
                    self._note_failure(exc, connecting=True)
                    return None
            self.counters["connects"] += 1
            if self._down_since is not None:
                log.info(
                    "infera-kvd %s: reconnected to %s after %.1f s; offload is back",
                    self.role,
                    self.socket_path,
                    now - self._down_since,
                )
            self._down_since = None
            self._lost_at = None
            self._backoff = self.retry_initial_s
            self._client = client
            return client

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
                self.failed(exc)
        raise KvdUnavailable(f"kvd at {self.socket_path} is unreachable: {self.last_error}")

    def failed(self, exc: BaseException) -> None:
        """Report that a call on the current client failed: drop it and start backing off."""
        with self._lock:
            client, self._client = self._client, None
            if client is not None:
                self._closing(client)
            self._note_failure(exc, connecting=False)

    def _note_failure(self, exc: BaseException, connecting: bool) -> None:
        now = self.clock()
        self.last_error = str(exc)
        if not connecting:
            # An established connection died (often a daemon restart): reopen at once, and only
            # call it an outage if that fails.
            self.counters["disconnects"] += 1
            log.info(
                "infera-kvd %s: connection to %s lost (%s); reconnecting", self.role, self.socket_path, exc
            )
            self._lost_at = now
            self._next_try = now
            return
        self.counters["connect_failures"] += 1
        if self._down_since is None:
            self._down_since = self._lost_at if self._lost_at is not None else now
            self.counters["outages"] += 1
            hint = " (this uid is not allowed)" if isinstance(exc, KvdRefused) else ""
            log.warning(
                "infera-kvd %s: daemon at %s unreachable%s: %s; serving by recompute, retrying in the background",
                self.role,
                self.socket_path,
                hint,
                exc,
            )
        else:
            log.debug("infera-kvd: daemon still unreachable: %s", exc)
            self._backoff = min(self._backoff * 2, self.retry_max_s)
        self._next_try = now + self._backoff

    def report(self, **fields: Any) -> None:
        client = self._client
        if client is None:
            return
        try:
            client.report(**fields)
        except KvdClientError as exc:
            self.failed(exc)

    def _closing(self, client: KvdClient) -> None:
        """Let the owner finish with the client's arena mapping (GPU copies in flight), then close."""
        if self.on_disconnect is not None:
            try:
                self.on_disconnect(client)
            except Exception:
                log.exception("infera-kvd %s: cleanup before closing the connection failed", self.role)
        client.close()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            self._closing(client)
