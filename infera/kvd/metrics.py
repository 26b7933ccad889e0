"""Prometheus text endpoint (``--metrics-port``), bound to 127.0.0.1 only.

It serves the snapshot the loop refreshes once a second, so scraping never touches the index
from another thread. Names are the STATS names prefixed with ``kvd_``, renamed where Prometheus'
naming rules want a unit or ``_total`` (:data:`RENAMES`, the tier tables); :data:`METRICS` has the
type and help line of each.

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

log = logging.getLogger("infera.kvd.metrics")

# -- the exposition -------------------------------------------------------------------------------
# Names follow Prometheus' rules: a unit suffix in base units (_bytes, _seconds), counters end in
# _total, and no label takes unbounded values (no pids, no sockets, no paths). Every name the
# endpoint can serve is in METRICS with its one-line help; docs/observability.md lists them too.

# STATS key -> exposed name, where the key alone does not follow the rules
RENAMES = {
    "bytes_in_total": "put_bytes_total",
    "bytes_out_total": "get_bytes_total",
    "arena_bytes_used": "arena_used_bytes",
    "arena_bytes_capacity": "arena_capacity_bytes",
    "arena_bytes_stored": "arena_stored_bytes",
    "arena_largest_free": "arena_largest_free_bytes",
    "uptime_s": "uptime_seconds",
}
SKIPPED = {"pid", "protocol"}  # a pid is no metric; the protocol is a label of kvd_build_info

# per-tier STATS fields that are levels, not running counts (everything else is a counter)
TIER_GAUGES = {
    "chunks": "tier_chunks",
    "bytes_used": "tier_used_bytes",
    "capacity": "tier_capacity_bytes",
    "queued_writes": "tier_queued_writes",
    "backlog": "tier_backlog",
    "unpersisted": "tier_unpersisted_chunks",
    "reads_in_flight": "tier_reads_in_flight",
    "connected": "tier_connected",
}
TIER_SECONDS = {  # levels in other units, converted to seconds
    "index_load_s": ("tier_index_load_seconds", 1.0),
    "read_latency_ms": ("tier_read_latency_seconds", 1e-3),
    "write_latency_ms": ("tier_write_latency_seconds", 1e-3),
    "exists_latency_ms": ("tier_exists_latency_seconds", 1e-3),
}
TIER_SKIPPED = {"latency_ms"}  # the same figure as read or write latency
TIER_COUNTER_RENAMES = {"bytes_read": "tier_read_bytes_total", "bytes_written": "tier_written_bytes_total"}

# name (without "kvd_") -> (type, help). Names not listed (a counter a tier adds later) are still
# served, typed by their suffix, with a generic help line.
METRICS: dict[str, tuple[str, str]] = {
    "build_info": ("gauge", "Always 1; labels: version, protocol, long_backend"),
    "start_time_seconds": ("gauge", "When the daemon started, in seconds since the epoch"),
    "uptime_seconds": ("gauge", "Seconds since the daemon started"),
    "chunks": ("gauge", "Chunks in the RAM tier"),
    "chunks_parked": ("gauge", "Chunks in use (leased, pinned or held) set aside from the eviction queues"),
    "reservations": ("gauge", "Open PUT reservations"),
    "arena_used_bytes": ("gauge", "Arena bytes in use (chunks, reservations, alignment)"),
    "arena_capacity_bytes": ("gauge", "Arena size (--max-bytes)"),
    "arena_stored_bytes": ("gauge", "Payload bytes of the chunks in RAM"),
    "arena_free_extents": ("gauge", "Free extents in the arena (fragmentation)"),
    "arena_largest_free_bytes": ("gauge", "Largest free extent in the arena"),
    "clients_connected": ("gauge", "Clients connected on the socket"),
    "clients": ("gauge", "Connected clients by name, role and data path"),
    "clients_fallback": ("gauge", "Connected clients on a fallback data path, by name, role and data path"),
    "hash_conflicts": (
        "gauge",
        "Models whose connected engines disagree on hash settings (never share chunks)",
    ),
    "warnings": ("gauge", "Warnings kvd stat shows"),
    "sets_total": ("counter", "Chunks stored (sealed) in the RAM tier"),
    "gets_total": ("counter", "Chunks asked for by GET"),
    "hits_total": ("counter", "GETs served, from RAM or the long tier"),
    "misses_total": ("counter", "GETs of chunks no tier holds"),
    "gets_direct_total": ("counter", "GETs the client reads from the long tier itself (GPU-direct)"),
    "evictions_total": ("counter", "Chunks evicted from RAM to make room"),
    "expired_total": ("counter", "Chunks dropped when their retention ran out"),
    "deletes_total": ("counter", "Chunks deleted by DELETE"),
    "lookups_total": ("counter", "LOOKUP requests"),
    "lookup_keys_total": ("counter", "Keys asked for by LOOKUP"),
    "lookup_hit_keys_total": ("counter", "Keys LOOKUP found (the hit ratio's numerator)"),
    "put_bytes_total": ("counter", "Payload bytes stored into the RAM tier"),
    "get_bytes_total": ("counter", "Payload bytes served by GET"),
    "put_rejected_total": ("counter", "PUTs refused (no room or too large)"),
    "put_rejected_full_total": ("counter", "PUTs refused because the arena was full even after eviction"),
    "put_none_total": ("counter", "PUTs with retention none (not stored)"),
    "put_exists_total": ("counter", "PUTs of chunks already stored"),
    "put_busy_total": ("counter", "PUTs of chunks another writer was storing"),
    "put_rolled_back_total": ("counter", "Reservations rolled back when a batch did not fit"),
    "aborts_total": ("counter", "Reservations aborted by their writer"),
    "evict_skipped_total": ("counter", "Eviction candidates skipped (leased or held)"),
    "corrupt_chunks_total": ("counter", "Chunks that failed their checksum on read (never served)"),
    "long_unpersisted_evicted_total": (
        "counter",
        "Long-retention chunks evicted from RAM before the long tier had them",
    ),
    "connections_total": ("counter", "Socket connections accepted"),
    "refused_total": ("counter", "Socket connections refused (uid check)"),
    "protocol_errors_total": ("counter", "Malformed or unknown requests"),
    "chunks_by_class": ("gauge", "Chunks in RAM by retention class"),
    "evictions_by_class_total": ("counter", "Chunks evicted from RAM by retention class"),
    "tier_info": ("gauge", "Always 1; labels: tier, backend, state"),
    "tier_chunks": ("gauge", "Chunks the tier holds"),
    "tier_used_bytes": ("gauge", "Bytes the tier holds"),
    "tier_capacity_bytes": ("gauge", "The tier's size (0: unbounded or unknown)"),
    "tier_queued_writes": ("gauge", "Chunks waiting to be written to the long tier"),
    "tier_backlog": ("gauge", "Writes waiting for the long tier to come back"),
    "tier_unpersisted_chunks": ("gauge", "Long-retention chunks in RAM the long tier does not have yet"),
    "tier_reads_in_flight": ("gauge", "Long-tier reads running"),
    "tier_connected": ("gauge", "1 while a distributed long tier is reachable"),
    "tier_index_load_seconds": ("gauge", "How long the disk tier took to rebuild its index at start"),
    "tier_read_latency_seconds": ("gauge", "Recent read latency of a distributed long tier"),
    "tier_write_latency_seconds": ("gauge", "Recent write latency of a distributed long tier"),
    "tier_exists_latency_seconds": ("gauge", "Recent exists-check latency of a distributed long tier"),
    "tier_hits_total": ("counter", "Chunks the tier served"),
    "tier_misses_total": ("counter", "Chunks asked of the tier that it did not have"),
    "tier_read_bytes_total": ("counter", "Bytes read from the tier"),
    "tier_written_bytes_total": ("counter", "Bytes written to the tier"),
    "tier_evictions_total": ("counter", "Chunks the tier evicted"),
    "tier_corrupt_chunks_total": ("counter", "Chunks read from the long tier that failed their checksum"),
    "tier_failed_writes_total": ("counter", "Long-tier writes that failed"),
    "tier_failed_reads_total": ("counter", "Long-tier reads that failed"),
    "tier_dropped_writes_total": ("counter", "Long-tier writes dropped (queue full or tier down)"),
    "tier_evicted_files_total": ("counter", "Chunk files the disk tier deleted to make room"),
    "tier_evicted_unwritten_total": (
        "counter",
        "Long-retention chunks evicted from RAM before the disk tier wrote them (lost)",
    ),
    "tier_files_written_total": ("counter", "Chunk files the disk tier wrote"),
    "tier_files_ignored_total": ("counter", "Files under --long-path that are not chunk files (left alone)"),
    "tier_files_other_version_total": ("counter", "Chunk files of another format version (not served)"),
    "tier_prewarmed_total": ("counter", "Chunks PREWARM pulled from the long tier into RAM"),
    "tier_promotion_no_room_total": (
        "counter",
        "Long-tier reads that found no room in RAM (answered as misses)",
    ),
    "tier_quarantined_total": ("counter", "Damaged chunk files moved aside"),
    "tier_recovered_writes_total": ("counter", "Long-tier writes that succeeded on a retry"),
    "tier_stale_temp_removed_total": ("counter", "Temporary files of interrupted writes removed at start"),
    "tier_write_retries_total": ("counter", "Long-tier writes retried after a failure"),
    "tier_adopted_total": (
        "counter",
        "Chunk files written by a client (GPU-direct) that the disk tier indexed",
    ),
    "tier_adopt_missing_total": (
        "counter",
        "Chunk files a client said it wrote that were missing or the wrong size",
    ),
    "tier_chunks_written_total": ("counter", "Chunks written to a distributed long tier"),
    "tier_removed_total": ("counter", "Chunks deleted from a distributed long tier"),
    "tier_resynced_total": ("counter", "Chunks re-queued for writing after a distributed tier came back"),
    "tier_backpressure_total": ("counter", "Writes a distributed tier refused for now (full, busy)"),
    "tier_timeouts_total": ("counter", "Distributed-tier calls that timed out"),
    "tier_exists_calls_total": ("counter", "Exists checks sent to a distributed tier"),
    "tier_exists_keys_total": ("counter", "Keys asked about by those exists checks"),
    "accept_errors_total": ("counter", "Failed accepts (out of descriptors); the listener backs off 0.1-1 s"),
    "output_paused_total": (
        "counter",
        "Times a client's unread replies passed 4 MiB and its requests were left unread",
    ),
    "output_dropped_total": ("counter", "Clients dropped for unread replies (16 MiB each, 32 MiB for all)"),
    "input_budget_drops_total": (
        "counter",
        "Clients dropped because partial frames of all clients passed 32 MiB",
    ),
    "replies_too_large_total": ("counter", "Replies over the frame cap, answered with a too_large error"),
    "namespace_ids_freed_total": ("counter", "Namespace ids freed for reuse"),
    "namespace_refused_total": (
        "counter",
        "HELLOs refused because no namespace id was free or the connection had 8",
    ),
    "input_buffered_bytes": ("gauge", "Bytes of partially received frames, all clients"),
    "output_queued_bytes": ("gauge", "Bytes of replies clients have not read yet, all clients"),
    "namespace_ids_in_use": ("gauge", "Namespace ids in use (of 65,535)"),
    "clients_omitted": ("gauge", "Clients left out of the STATS client list (it lists 64)"),
    "namespaces_omitted": ("gauge", "Namespaces left out of the STATS namespace list"),
    "metrics_connections_total": ("counter", "Connections to this endpoint"),
    "metrics_requests_total": ("counter", "Requests to this endpoint"),
    "metrics_closed_timeout_total": ("counter", "Endpoint connections closed at their deadline"),
    "metrics_closed_over_cap_total": ("counter", "Endpoint connections closed to make room for a new one"),
}


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _labels(**kv: object) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kv.items()) + "}"


def _num(value: object) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


def render(stats: dict[str, Any]) -> str:
    """Render a STATS snapshot in the Prometheus text exposition format."""
    from infera.keyrules import fingerprint_conflicts

    families: dict[str, list[str]] = {}  # each family's lines stay together, as the format wants

    def metric(name: str, kind: str, value: float, labels: str = "") -> None:
        full = f"kvd_{name}"
        lines = families.get(full)
        if lines is None:
            known = METRICS.get(name)
            lines = families[full] = [
                f"# HELP {full} {known[1] if known else name.replace('_', ' ')}",
                f"# TYPE {full} {known[0] if known else kind}",
            ]
        lines.append(f"{full}{labels} {value}")

    metric(
        "build_info",
        "gauge",
        1,
        _labels(
            version=stats.get("version", ""),
            protocol=stats.get("protocol", ""),
            long_backend=stats.get("long_backend") or "none",
        ),
    )
    for key in sorted(stats):
        value = stats[key]
        if key in SKIPPED or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = RENAMES.get(key, key)
        metric(name, "counter" if name.endswith("_total") else "gauge", value)
    for cls, n in sorted(stats.get("chunks_by_class", {}).items()):
        metric("chunks_by_class", "gauge", n, _labels(retention=cls))
    for cls, n in sorted(stats.get("evictions_by_class", {}).items()):
        metric("evictions_by_class_total", "counter", n, _labels(retention=cls))
    _tiers(stats.get("tiers", {}), metric)
    _clients(stats.get("clients", []), metric)
    metric("hash_conflicts", "gauge", len(fingerprint_conflicts(stats.get("clients", []))))
    metric("warnings", "gauge", len(stats.get("warnings", [])))
    return "\n".join(line for lines in families.values() for line in lines) + "\n"


def _tiers(tiers: dict[str, Any], metric: Any) -> None:
    for tier, fields in sorted(tiers.items()):
        lab = _labels(tier=tier)
        state = fields.get("state") or "ready"
        metric(
            "tier_info", "gauge", 1, _labels(tier=tier, backend=fields.get("backend", "arena"), state=state)
        )
        for fname, raw in sorted(fields.items()):
            value = _num(raw)
            if value is None or fname in TIER_SKIPPED:
                continue
            if fname in TIER_GAUGES:
                metric(TIER_GAUGES[fname], "gauge", value, lab)
            elif fname in TIER_SECONDS:
                name, scale = TIER_SECONDS[fname]
                metric(name, "gauge", round(value * scale, 6), lab)
            else:
                metric(TIER_COUNTER_RENAMES.get(fname, f"tier_{fname}_total"), "counter", value, lab)


def _clients(clients: list[dict[str, Any]], metric: Any) -> None:
    """Connected clients counted by (name, role, data path): bounded labels, never a pid. Each
    client's own counters are in ``kvd stat``; an engine's are on vLLM's endpoint (vllm:kvd_*)."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for c in clients:
        key = (str(c.get("name") or "-"), str(c.get("role") or "client"), str(c.get("data_path") or "none"))
        counts = groups.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += int(bool(c.get("fallback")))
    for (name, role, path), (n, fallback) in sorted(groups.items()):
        lab = _labels(name=name, role=role, data_path=path)
        metric("clients", "gauge", n, lab)
        metric("clients_fallback", "gauge", fallback, lab)


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
