"""Prometheus text endpoint (``--metrics-port``), bound to 127.0.0.1 only.

It serves the snapshot the loop refreshes once a second, so scraping never touches the index
from another thread. Counter names are the STATS names prefixed with ``kvd_``.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from infera.errors import KvdError

if TYPE_CHECKING:
    from infera.kvd.server import Server

log = logging.getLogger("infera.kvd.metrics")

GAUGES = {
    "chunks",
    "reservations",
    "arena_bytes_used",
    "arena_bytes_capacity",
    "arena_bytes_stored",
    "arena_free_extents",
    "arena_largest_free",
    "clients_connected",
    "uptime_s",
}


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render(stats: dict[str, Any]) -> str:
    """Render a STATS snapshot in the Prometheus text exposition format."""
    out: list[str] = []
    declared: set[str] = set()

    def metric(name: str, kind: str, value: float, labels: str = "") -> None:
        full = f"kvd_{name}"
        if full not in declared:
            declared.add(full)
            out.append(f"# TYPE {full} {kind}")
        out.append(f"{full}{labels} {value}")

    for key in sorted(stats):
        value = stats[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        kind = "gauge" if key in GAUGES or not key.endswith("_total") else "counter"
        metric(key, kind, value)
    for cls, n in sorted(stats.get("chunks_by_class", {}).items()):
        metric("chunks_by_class", "gauge", n, f'{{retention="{_esc(cls)}"}}')
    for cls, n in sorted(stats.get("evictions_by_class", {}).items()):
        metric("evictions_by_class_total", "counter", n, f'{{retention="{_esc(cls)}"}}')
    for tier, fields in sorted(stats.get("tiers", {}).items()):
        for fname, value in sorted(fields.items()):
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int | float):
                metric(f"tier_{fname}", "gauge", value, f'{{tier="{_esc(tier)}"}}')
    for client in stats.get("clients", []):
        labels = (
            f'{{pid="{client.get("pid")}",name="{_esc(client.get("name", ""))}",'
            f'role="{_esc(client.get("role", ""))}",data_path="{_esc(client.get("data_path", ""))}"}}'
        )
        metric("client_fallback", "gauge", int(bool(client.get("fallback"))), labels)
        for cname, cval in sorted(client.get("counters", {}).items()):
            if isinstance(cval, int | float) and not isinstance(cval, bool):
                metric(f"client_{cname}", "gauge", cval, labels)
    metric("warnings", "gauge", len(stats.get("warnings", [])))
    return "\n".join(out) + "\n"


class MetricsServer:
    def __init__(self, server: Server, port: int) -> None:
        self.server = server
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "try /metrics")
                    return
                body = render(outer.server.snapshot_cache).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics: " + format, *args)

        try:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            raise KvdError(
                f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror}",
                hint="pick a free port",
            ) from None
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kvd-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("metrics on http://127.0.0.1:%d/metrics", self.httpd.server_address[1])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
