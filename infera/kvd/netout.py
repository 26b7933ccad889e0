"""Replies of the daemon's loop: queued per connection and sent without blocking, within budgets.

The sending half of the connection I/O, a mixin of :class:`infera.kvd.server.Server` beside
:class:`~infera.kvd.netio.NetIO` (reading, turns, accepting). The rules both keep, and why, are in
:mod:`infera.kvd.netio`; the limits on queued replies are here.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
from typing import TYPE_CHECKING, Any

from infera.kvd import protocol as P
from infera.kvd.netio import warn_dropped

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.conn import Client
    from infera.kvd.netio import NetState

log = logging.getLogger("infera.kvd")

OUT_PAUSE_BYTES = 4 << 20  # queued replies above which the loop stops reading a client's requests
OUT_RESUME_BYTES = 1 << 20  # ... and below which it reads them again
OUT_DROP_BYTES = 16 << 20  # queued replies above which a client is dropped
OUT_BUDGET_BYTES = 32 << 20  # queued replies of all clients together
_BIG = P.CHECKED_BODY  # replies above this are checked against the frame cap
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


class NetOut:
    """Mixin of the loop's replies; :class:`infera.kvd.server.Server` provides the state."""

    cfg: DaemonConfig
    sel: selectors.BaseSelector
    clients: dict[int, Client]
    net: NetState  # NetIO
    _ready: dict[int, Client]  # NetIO

    def _drop(self, client: Client, why: str) -> None:  # provided by Server
        raise NotImplementedError

    def _send(self, client: Client, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        """Queue one reply; never blocks. Sent at once when nothing is queued before it."""
        frame = P.encode(msg)
        if len(frame) > _BIG and len(frame) - 4 > self.cfg.max_frame:
            self.net.replies_too_large_total += 1
            log.warning("a %d-byte reply to client %d exceeds the frame cap", len(frame), client.id)
            fds = None
            frame = P.encode(
                {
                    "id": msg.get("id", 0),
                    "ok": False,
                    "error": "too_large",
                    "message": f"the reply ({len(frame)} bytes) would exceed the frame cap",
                }
            )
        out = client.out
        if not out.size:  # nothing queued before it: straight to the kernel
            try:
                sent = socket.send_fds(client.sock, [frame], fds) if fds else client.sock.send(frame)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._drop(client, f"write error: {exc}")
                return
            if sent == len(frame):
                return
            out.push(memoryview(frame)[sent:], None if sent else fds)
            self.net.out_total += len(frame) - sent
        else:
            out.push(frame, fds)
            self.net.out_total += len(frame)
        if self.net.out_total > OUT_BUDGET_BYTES:
            self._shed_output()
            if client.closed:
                return
        if out.size > OUT_PAUSE_BYTES:
            if out.size > OUT_DROP_BYTES:
                self.net.output_dropped_total += 1
                warn_dropped(client, f"{out.size} bytes of replies queued, over {OUT_DROP_BYTES}")
                self._drop(client, "not reading its replies")
                return
            if not client.out_paused:
                client.out_paused = True
                self.net.output_paused_total += 1
                if not client.out_logged:
                    client.out_logged = True
                    log.warning(
                        "client %d (pid %s) is not reading its replies: %d bytes queued; its "
                        "requests wait until it catches up (logged once per connection)",
                        client.id,
                        client.info.get("pid", client.peer_pid),
                        out.size,
                    )
        self._interest(client)

    def _shed_output(self) -> None:
        """Over the daemon-wide budget of queued replies: drop the clients holding the most."""
        net = self.net
        for victim in sorted((c for c in self.clients.values() if c.out.size), key=lambda c: -c.out.size):
            if net.out_total <= OUT_BUDGET_BYTES:
                break
            net.output_dropped_total += 1
            warn_dropped(
                victim,
                f"{victim.out.size} bytes of replies queued while all clients together hold over {OUT_BUDGET_BYTES}",
            )
            self._drop(victim, "not reading its replies")

    def _flush(self, client: Client) -> None:
        """Hand the kernel what it takes of a client's queue; raises OSError if the socket broke."""
        out = client.out
        before = out.size
        try:
            out.flush(client.sock)
        finally:
            self.net.out_total -= before - out.size

    def _send_last(self, client: Client, code: str, why: str) -> None:
        """Say why (best effort, without waiting) and hang up."""
        self._send(client, {"id": 0, "ok": False, "error": code, "message": why})
        if not client.closed:
            with contextlib.suppress(OSError):
                self._flush(client)
        self._drop(client, why)

    def _on_writable(self, client: Client) -> None:
        try:
            self._flush(client)
        except OSError as exc:
            self._drop(client, f"write error: {exc}")
            return
        if client.out_paused and client.out.size <= OUT_RESUME_BYTES:
            client.out_paused = False
            if client.inbox:
                self._ready[client.id] = client
        self._interest(client)

    def _interest(self, client: Client) -> None:
        """Watch a client for what it can use now: requests unless its replies pile up or frames
        of it wait for a turn, writability while replies are queued."""
        want = (0 if client.inbox or client.out_paused else _READ) | (_WRITE if client.out.size else 0)
        have = client.events
        if want == have or client.closed:
            return
        client.events = want
        if not want:
            self.sel.unregister(client.sock)
        elif not have:
            self.sel.register(client.sock, want, ("client", client))
        else:
            self.sel.modify(client.sock, want, ("client", client))
