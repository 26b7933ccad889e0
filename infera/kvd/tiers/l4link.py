"""Connection state of a distributed long tier: probing, (re)connecting, states and errors.

A monitor thread probes the store every ``PROBE_INTERVAL_S`` (a short TCP connect or a health
request, never a call that can block for long) and connects when it answers. A connect that
fails (``setup_failures``, also counted in ``errors``) is tried again ``CONNECT_BACKOFF_S`` later,
doubling up to ``CONNECT_BACKOFF_MAX_S``; the wait restarts from the first step once the probe
fails (the store went away) or a connect works. The state is
``loading`` until the first connection, ``disconnected`` while the store does not answer (no
call is made then), ``degraded`` for ``DEGRADED_HOLD_S`` after any failed operation, else
``ready``. Every change is logged once and counted; repeated errors of one kind are logged up to
``LOG_MAX`` times, then only counted. Existence checks run on one meta thread with a deadline,
and never queue behind a call that is still stuck.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera.kvd.tiers.transport import Region, Transport, TransportError

if TYPE_CHECKING:
    from infera.kvd.tiers.base import TierHost

log = logging.getLogger("infera.kvd.l4")

PROBE_INTERVAL_S = 1.0
CONNECT_BACKOFF_S = 1.0
CONNECT_BACKOFF_MAX_S = 30.0
DEGRADED_HOLD_S = 10.0
LOG_MAX = 20


class _Call:
    __slots__ = ("error", "event", "fn", "result", "started")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.event = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = 0.0


class Link:
    """The connection half of :class:`infera.kvd.tiers.remote.RemoteTier`. Subclasses provide
    ``_regions()`` (what to register at connect), ``_reconnected()`` and ``_disconnected()``;
    every attribute here is written on the loop thread only."""

    backend = "?"

    def __init__(self, host: TierHost, transport: Transport, counters: dict[str, int]) -> None:
        self.host = host
        self.t = transport
        self.c = counters
        for name in ("errors", "timeouts", "state_changes", "disconnects", "reconnects", "setup_failures"):
            self.c.setdefault(name, 0)
        self.ever_connected = False
        self.connecting = True
        self.down: str | None = None
        self.trouble_at = 0.0
        self.last_error: str | None = None
        self.setup_failing = False  # the store answers but connecting to it fails
        self._state = "loading"
        self._logged: dict[str, int] = {}
        self.latency: dict[str, float | None] = {"read_ms": None, "write_ms": None, "exists_ms": None}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._meta_q: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._meta_busy: _Call | None = None
        self._threads = [
            threading.Thread(target=self._monitor, name="kvd-l4-monitor", daemon=True),
            threading.Thread(target=self._meta_loop, name="kvd-l4-meta", daemon=True),
        ]

    def _start_link(self) -> None:
        for t in self._threads:
            t.start()

    def _regions(self) -> tuple[Region, Region]:
        raise NotImplementedError

    def _reconnected(self) -> None:
        """The store answers again after it did not (loop thread)."""

    def _disconnected(self) -> None:
        """The store stopped answering (loop thread)."""

    # -- state -------------------------------------------------------------------
    @property
    def loading(self) -> bool:
        return self._state == "loading"

    @property
    def state(self) -> str:
        if self.down is not None:
            return "disconnected"
        if not self.ever_connected:
            return "loading" if self.connecting else "disconnected"
        if self.trouble_at and time.monotonic() - self.trouble_at < DEGRADED_HOLD_S:
            return "degraded"
        return "ready"

    def _usable(self) -> bool:
        return self.ever_connected and self.down is None

    def _monitor(self) -> None:
        """Probe the store every second; connect (or reconnect) when it answers, with back-off
        between failed connects."""
        backoff, next_connect, failed = 0.0, 0.0, ""
        while not self._stop.is_set():
            why: str | None = None
            attempt = False
            try:
                self.t.probe()
                if not self.t.connected and time.monotonic() < next_connect:
                    why = failed  # waiting out the back-off: the last failure still stands
                elif not self.t.connected:
                    attempt = True
                    self.host.call_soon(lambda: self._set_connecting(True))
                    self.t.connect(*self._regions())
                    backoff = 0.0
            except TransportError as exc:
                why = str(exc)
                if self.t.connected:
                    self.t.reset()
                if not attempt:
                    backoff, next_connect = 0.0, 0.0
            except Exception as exc:  # a bug in a client library must not end the monitor
                log.exception("%s: connecting failed", self.backend)
                why = f"{type(exc).__name__}: {exc}"
            if attempt and why is not None:
                failed = why
                backoff = min(CONNECT_BACKOFF_MAX_S, backoff * 2 or CONNECT_BACKOFF_S)
                next_connect = time.monotonic() + backoff
            if self._stop.is_set():
                return
            phase = "connect" if attempt else "backoff" if why is not None and why is failed else "probe"
            self.host.call_soon(lambda w=why, p=phase: self._probed(w, p))  # type: ignore[misc]
            self._wake.wait(PROBE_INTERVAL_S)
            self._wake.clear()

    def _set_connecting(self, on: bool) -> None:
        self.connecting = on

    def _probed(self, why: str | None, phase: str = "probe") -> None:
        """The monitor's verdict (loop thread). ``phase``: ``connect`` (it tried to connect),
        ``backoff`` (the store answers, the next connect waits) or ``probe``."""
        self.connecting = False
        if phase != "backoff":
            self.setup_failing = phase == "connect" and why is not None
        if phase == "connect" and why is not None:
            self.c["setup_failures"] += 1
            self.c["errors"] += 1
            n = self._logged.get("setup", 0)
            if n < LOG_MAX and self.down is not None:  # the first one is logged by the state change
                self._logged["setup"] = n + 1
                log.warning(
                    "%s long tier: connecting failed again (retried with back-off): %s", self.backend, why
                )
            self.last_error = why
        if why is None:
            first = not self.ever_connected
            was_down = self.down is not None
            self.ever_connected = True
            self.down = None
            if first:
                log.info("%s long tier connected to %s", self.backend, self.t.endpoint)
            elif was_down:
                self.c["reconnects"] += 1
                self._reconnected()
        else:
            if self.down is None:
                self.c["disconnects"] += 1 if self.ever_connected else 0
                self.last_error = why
            self.down = why
        self._update_state()

    def _update_state(self) -> None:
        new = self.state
        if new == self._state:
            return
        old, self._state = self._state, new
        self.c["state_changes"] += 1
        if new == "disconnected":
            until = (
                "connecting works (retried 1, 2, 4 … 30 s apart)"
                if self.setup_failing
                else f"{self.t.endpoint} answers again"
            )
            log.warning(
                "%s long tier %s -> disconnected (%s): RAM keeps serving, L4 calls are skipped until %s",
                self.backend,
                old,
                self.down or self.last_error,
                until,
            )
            self._disconnected()
        elif new == "degraded":
            log.warning("%s long tier %s -> degraded: %s", self.backend, old, self.last_error)
        else:
            log.info("%s long tier %s -> %s", self.backend, old, new)

    def _trouble(self, kind: str, message: str) -> None:
        """Record a failed operation (loop thread): degraded for a while; ``down`` asks the
        monitor to probe now, and only the probe decides that the store is gone."""
        self.c["errors"] += 1
        self.trouble_at = time.monotonic()
        self.last_error = message
        n = self._logged.get(kind, 0)
        if n < LOG_MAX:
            self._logged[kind] = n + 1
            log.warning(
                "%s long tier: %s%s",
                self.backend,
                message,
                " (further ones counted)" if n + 1 == LOG_MAX else "",
            )
        if kind == "down":
            self._wake.set()
        self._update_state()

    def _latency(self, which: str, seconds: float) -> None:
        ms = seconds * 1000.0
        old = self.latency[which]
        self.latency[which] = ms if old is None else old * 0.8 + ms * 0.2

    # -- existence checks --------------------------------------------------------------------
    def _meta_loop(self) -> None:
        while True:
            call = self._meta_q.get()
            if call is None:
                return
            try:
                call.result = call.fn()
            except BaseException as exc:
                call.error = exc
            call.event.set()

    def _meta_call(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` on the meta thread and wait at most ``timeout``; never queue behind a call
        that is still stuck (then fail at once)."""
        busy = self._meta_busy
        if busy is not None and not busy.event.is_set():
            raise TransportError("the previous existence check has not returned yet", "timeout")
        call = _Call(fn)
        self._meta_busy = call
        self._meta_q.put(call)
        if not call.event.wait(timeout):
            raise TransportError(f"no answer within {timeout * 1000:.0f} ms", "timeout")
        if call.error is not None:
            raise call.error
        return call.result

    def _stop_link(self) -> bool:
        """Stop the monitor and meta threads; False if one is still inside a client call."""
        self._stop.set()
        self._wake.set()
        self.t.interrupt()
        self._meta_q.put(None)
        for t in self._threads:
            t.join(2.0)
        return not any(t.is_alive() for t in self._threads)


__all__ = [
    "CONNECT_BACKOFF_MAX_S",
    "CONNECT_BACKOFF_S",
    "DEGRADED_HOLD_S",
    "LOG_MAX",
    "PROBE_INTERVAL_S",
    "Link",
]
