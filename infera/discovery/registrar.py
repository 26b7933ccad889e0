"""Keep one worker registered in etcd under a lease, from a background thread.

The thread waits until the server is ready (``ready()``), then grants a lease of ``ttl`` seconds,
puts the worker's record under it, and refreshes the lease every ``ttl / 3`` seconds. If the
process dies, nobody refreshes the lease and etcd deletes the key within ``ttl`` seconds; on a
clean stop the lease is revoked, which deletes the key at once.

etcd being unreachable never stops the engine: the registrar logs one line when a streak of
failures starts (and one when it ends), retries with exponential backoff, counts every failed
attempt in ``failures``, and registers again with a fresh lease when its old one expired.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from infera.discovery.etcd import EtcdClient, EtcdError
from infera.discovery.record import DEFAULT_TTL_S

log = logging.getLogger("infera.discovery")

MIN_TTL_S = 2


class Registrar:
    """Registers ``record()`` under ``key`` in the etcd at ``endpoints`` while the process lives.

    ``record`` is called once, when ``ready()`` first returns True; the registrar adds the fields
    ``lease``, ``lease_ttl_s``, ``registered_at`` and ``registration_failures``. ``on_failure`` and
    ``on_state`` let the caller count failures and export the state (e.g. as metrics).
    """

    def __init__(
        self,
        endpoints: str,
        key: str,
        record: Callable[[], dict[str, Any]],
        *,
        ttl: int = DEFAULT_TTL_S,
        ready: Callable[[], bool] | None = None,
        ready_interval: float = 0.5,
        backoff: tuple[float, float] = (0.5, 10.0),
        timeout: float = 2.0,
        logger: logging.Logger | None = None,
        on_failure: Callable[[EtcdError], None] | None = None,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        if ttl < MIN_TTL_S:
            raise ValueError(f"lease TTL must be at least {MIN_TTL_S} s (got {ttl})")
        self.key = key
        self.ttl = int(ttl)
        self._client = EtcdClient(endpoints, timeout=timeout)
        self._record_fn = record
        self._ready = ready or (lambda: True)
        self._ready_interval = ready_interval
        self._backoff = backoff
        self._log = logger or log
        self._on_failure = on_failure
        self._on_state = on_state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.lease: str | None = None
        self.record: dict[str, Any] | None = None
        self.failures = 0
        self.registrations = 0
        self.state = "waiting"
        self.last_error: str | None = None
        self.registered = threading.Event()

    @property
    def endpoint(self) -> str:
        return self._client.endpoint

    def start(self) -> Registrar:
        self._thread = threading.Thread(target=self._run, name="infera-discovery", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop refreshing and revoke the lease (the key goes away at once). True if it deregistered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            lease, self.lease = self.lease, None
            done = False
            if lease is not None:
                try:
                    self._client.revoke(lease)
                    done = True
                    self._log.info("infera-kvd: deregistered %s from etcd at %s", self.key, self.endpoint)
                except EtcdError as exc:
                    self._log.warning(
                        "infera-kvd: could not deregister %s from etcd (%s); it expires within %d s",
                        self.key,
                        exc,
                        self.ttl,
                    )
            self._set_state("stopped")
            self.registered.clear()
        self._client.close()
        return done

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            if self._on_state is not None:
                self._on_state(state)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._ready():
                    break
            except Exception:  # a probe that raises means "not ready yet"
                pass
            self._stop.wait(self._ready_interval)
        if self._stop.is_set():
            return
        try:
            base = self._record_fn()
        except Exception as exc:  # never take the engine down over discovery
            self._log.warning("infera-kvd: not registering in etcd: cannot describe this worker (%s)", exc)
            self._set_state("failed")
            return
        delay = self._backoff[0]
        failing = False
        while not self._stop.is_set():
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._step(base)
                if failing:
                    self._log.info(
                        "infera-kvd: etcd at %s reachable again; %s registered (%d failed attempts so far)",
                        self.endpoint,
                        self.key,
                        self.failures,
                    )
                failing, delay = False, self._backoff[0]
                self._stop.wait(max(0.5, self.ttl / 3))
            except EtcdError as exc:
                self.failures += 1
                self.last_error = exc.message
                if self._on_failure is not None:
                    self._on_failure(exc)
                if not failing:
                    self._log.warning(
                        "infera-kvd: cannot register %s in etcd (%s); the engine keeps serving, "
                        "retrying with backoff up to %.0f s",
                        self.key,
                        exc.message,
                        self._backoff[1],
                    )
                failing = True
                self._set_state("retrying")
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff[1])

    def _step(self, base: dict[str, Any]) -> None:
        """One round: register with a new lease, or refresh the one we have."""
        if self.lease is not None:
            if self._client.keepalive(self.lease) > 0:
                return
            self._log.warning(
                "infera-kvd: etcd lease of %s expired (etcd was unreachable for over %d s); registering again",
                self.key,
                self.ttl,
            )
            self.lease = None
            self.registered.clear()
        lease, granted = self._client.grant(self.ttl)
        record = {
            **base,
            "lease": lease,
            "lease_ttl_s": granted,
            "registered_at": round(time.time(), 3),
            "registration_failures": self.failures,
        }
        try:
            self._client.put(self.key, json.dumps(record, separators=(",", ":")), lease=lease)
        except EtcdError:
            try:
                self._client.revoke(lease)
            except EtcdError:
                pass
            raise
        self.lease, self.record = lease, record
        self.registrations += 1
        self.registered.set()
        self._set_state("registered")
        if self.registrations == 1:
            self._log.info(
                "infera-kvd: registered as %s worker %s in etcd at %s (lease TTL %d s)",
                record.get("role", "?"),
                self.key,
                self.endpoint,
                granted,
            )
