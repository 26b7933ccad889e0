"""Prometheus text endpoint (``--metrics-port``), bound to 127.0.0.1 only.

It serves the snapshot the loop refreshes once a second, so scraping never touches the index
from another thread; :mod:`infera.kvd.exposition` names and renders it.

One thread serves every connection (a selector, non-blocking sockets), so a scraper that connects
and says nothing, or never reads its reply, costs a socket and no thread, and cannot hold up
anyone else. Bounds: at most :data:`MAX_CONNECTIONS` open at once (a new one closes the oldest),
each one closed :data:`CONN_TIMEOUT_S` after it connected whatever its state, a request head of
at most :data:`MAX_REQUEST_BYTES`. The text is rendered once per snapshot, not once per scrape.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol

from infera.errors import KvdError
from infera.kvd.exposition import METRICS, render

log = logging.getLogger("infera.kvd.metrics")


MAX_CONNECTIONS = 32  # open scrape connections; one more closes the oldest
CONN_TIMEOUT_S = 5.0  # from connect to the last byte of the reply
MAX_REQUEST_BYTES = 8192  # request line and headers
LISTEN_BACKLOG = 128


class _Conn:
    __slots__ = ("deadline", "inbuf", "out", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.inbuf = bytearray()
        self.out: memoryview | None = None  # the reply, once the request head is in


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class StatsSource(Protocol):
    """What the endpoint reads of the daemon: the snapshot the loop publishes."""

    @property
    def snapshot_cache(self) -> dict[str, Any]: ...


class MetricsServer:
    """The endpoint: one thread, one selector, every connection bounded in number and time."""

    def __init__(self, server: StatsSource, port: int) -> None:
        self.server = server
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            raise KvdError(
                f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror}",
                hint="pick a free port",
            ) from None
        sock.setblocking(False)
        self.listener = sock
        self.port = int(sock.getsockname()[1])
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: OrderedDict[int, _Conn] = OrderedDict()  # by fd, oldest first
        self._stopping = False
        self._rendered: tuple[dict[str, Any], bytes] | None = None  # (snapshot, its text)
        # served as kvd_metrics_<name> (this thread's own; the loop's STATS do not carry them)
        self.c = dict.fromkeys(
            ("connections_total", "requests_total", "closed_timeout_total", "closed_over_cap_total"), 0
        )
        self.thread = threading.Thread(target=self._run, name="kvd-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("metrics on http://127.0.0.1:%d/metrics", self.port)

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if self.thread.is_alive():
            self.thread.join(5.0)
        for conn in list(self._conns.values()):
            self._close(conn)
        with contextlib.suppress(Exception):
            self.sel.close()
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            timeout = 1.0
            if self._conns:
                first = next(iter(self._conns.values()))
                timeout = min(timeout, max(0.0, first.deadline - time.monotonic()))
            try:
                events = self.sel.select(timeout)
            except OSError:  # closed under us at shutdown
                return
            try:
                self._handle(events)
            except Exception:  # a bug here must not end the endpoint, nor touch the daemon
                log.exception("metrics endpoint: internal error")

    def _handle(self, events: list[tuple[selectors.SelectorKey, int]]) -> None:
        for key, mask in events:
            data = key.data
            if data == "accept":
                self._accept()
            elif data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif isinstance(data, _Conn) and data.sock.fileno() >= 0:
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(data)
                    if mask & selectors.EVENT_WRITE and data.sock.fileno() >= 0:
                        self._write(data)
                except Exception:  # one connection's trouble is never the endpoint's
                    log.debug("metrics: connection failed", exc_info=True)
                    self._close(data)
        now = time.monotonic()
        while self._conns:
            first = next(iter(self._conns.values()))
            if first.deadline > now:
                break
            self.c["closed_timeout_total"] += 1
            self._close(first)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: the listener stays readable; do not spin on it
                log.debug("metrics: accept failed: %s", exc)
                time.sleep(0.05)
                return
            sock.setblocking(False)
            self.c["connections_total"] += 1
            while len(self._conns) >= MAX_CONNECTIONS:
                self.c["closed_over_cap_total"] += 1
                self._close(next(iter(self._conns.values())))
            conn = _Conn(sock, time.monotonic() + CONN_TIMEOUT_S)
            self._conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbuf.find(b"\n\n")
        if end < 0:
            if len(conn.inbuf) > MAX_REQUEST_BYTES:
                self._reply(conn, _response("431 Request Header Fields Too Large", b"request too large\n"))
            return
        self._reply(conn, self._respond(bytes(conn.inbuf[:end])))

    def _respond(self, head: bytes) -> bytes:
        self.c["requests_total"] += 1
        parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
        if len(parts) < 2:
            return _response("400 Bad Request", b"bad request\n")
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            return _response("405 Method Not Allowed", b"GET /metrics\n")
        if target.split(b"?", 1)[0] not in (b"/metrics", b"/"):
            return _response("404 Not Found", b"try /metrics\n")
        body = self._metrics_body() + self._own_metrics()
        reply = _response("200 OK", body, "text/plain; version=0.0.4; charset=utf-8")
        if method == b"HEAD":
            return reply[: len(reply) - len(body)]
        return reply

    def _metrics_body(self) -> bytes:
        """The text of the current snapshot, rendered once per snapshot. The loop replaces
        ``snapshot_cache`` wholesale and never changes a published one, so reading it here,
        without a lock, sees one consistent snapshot and never touches the store."""
        snap = self.server.snapshot_cache
        cached = self._rendered
        if cached is None or cached[0] is not snap:
            cached = self._rendered = (snap, render(snap).encode())
        return cached[1]

    def _own_metrics(self) -> bytes:
        """The endpoint's own counters (``kvd_metrics_*``)."""
        lines = []
        started = getattr(self.server, "started", None)
        if started is not None:  # exact, so changes() of it counts restarts and nothing else
            lines.append(
                f"# HELP kvd_start_time_seconds {METRICS['start_time_seconds'][1]}\n"
                f"# TYPE kvd_start_time_seconds gauge\nkvd_start_time_seconds {started:.3f}\n"
            )
        for name, value in self.c.items():
            help_ = METRICS.get(f"metrics_{name}", ("counter", name))[1]
            lines.append(
                f"# HELP kvd_metrics_{name} {help_}\n# TYPE kvd_metrics_{name} counter\n"
                f"kvd_metrics_{name} {value}\n"
            )
        return "".join(lines).encode()

    def _reply(self, conn: _Conn, data: bytes) -> None:
        conn.out = memoryview(data)
        # from here on only the reply matters: whatever else the client sends is not read (and
        # a client that shuts its side after the request still gets the whole reply)
        self.sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        out = conn.out
        if out is None:
            return
        try:
            n = conn.sock.send(out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.out = out = out[n:]
        if not out:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        sock = conn.sock
        fd = sock.fileno()
        if fd < 0:
            return
        self._conns.pop(fd, None)
        with contextlib.suppress(Exception):
            self.sel.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()
