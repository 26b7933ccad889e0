"""Connection I/O of the daemon's loop: what one client may cost the others, and no more.

The loop is single-threaded (see :mod:`infera.kvd.server`), so anything that blocks it, or lets one
connection hold unbounded memory, is paid by every engine on the host. This module (reading, turns,
accepting) and :mod:`infera.kvd.netout` (replies) hold the rules that keep a stuck, slow or hostile
client's cost on its own connection:

* Nothing here ever blocks. Replies go out from a per-connection :class:`OutQueue` when the socket
  is writable; descriptors (the arena fd of HELLO) travel with the first byte of their own frame.
  A client that stops reading (a SIGSTOPped engine) only grows its own queue.
* A queue above :data:`~infera.kvd.netout.OUT_PAUSE_BYTES` stops the loop reading that client's
  requests until it drains below :data:`~infera.kvd.netout.OUT_RESUME_BYTES`; one above
  :data:`~infera.kvd.netout.OUT_DROP_BYTES` (replies the client did not ask for in this turn, e.g.
  answers a long tier completes later) drops the connection. The queues of all clients together
  hold at most :data:`~infera.kvd.netout.OUT_BUDGET_BYTES` (many connections that each ask one big
  STATS and never read); over it, those holding the most are dropped.
* One turn handles at most :data:`FRAMES_PER_TURN` frames of a connection, or
  :data:`TURN_BUDGET_S` of work; the rest wait for the next turn, so a pipelined flood shares the
  loop with everyone else (a healthy request waits at most one turn per flooding connection). A
  single request with a big batch is handled a slice per turn (:mod:`infera.kvd.slices`).
* Partially received frames of all connections together hold at most :data:`INPUT_BUDGET_BYTES`;
  over it, the connections whose incomplete frame began the longest ago are dropped (parked
  ones; a client sending a big request at speed has the youngest). One burst can drop many: they
  are logged as one line, at most once per :data:`BUDGET_LOG_EVERY_S`, with the count since the
  last line (the loop's tick writes the last count of a burst).
* An accept that fails for want of descriptors or memory (EMFILE, ENFILE, ...) stops watching the
  listener for a back-off (:data:`ACCEPT_BACKOFF_S`, doubling up to :data:`ACCEPT_BACKOFF_MAX_S`)
  instead of spinning on a listener that stays readable; logged at most once per
  :data:`ACCEPT_LOG_EVERY_S` with the count of failures since.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera.kvd import protocol as P
from infera.kvd.slices import Sliced, at_front_waiting
from infera.kvd.spin import SpinGate

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.conn import Client

log = logging.getLogger("infera.kvd")

FRAMES_PER_TURN = 64  # frames of one connection handled per loop turn
TURN_BUDGET_S = 0.002  # ... and the time they may take (checked after each frame)
INPUT_BUDGET_BYTES = 32 << 20  # partially received frames of all connections together
ACCEPT_BACKOFF_S = 0.1  # first pause of the listener after a failed accept
ACCEPT_BACKOFF_MAX_S = 1.0
ACCEPT_LOG_EVERY_S = 60.0  # one line per episode of failed accepts, not one per failure
BUDGET_LOG_EVERY_S = 1.0  # input-budget drops: one line per second at most, with a count
_READ = selectors.EVENT_READ


class NetState:
    """Counters and seldom-used state of the connection I/O, kept off the server object: CPython
    reads attributes fastest for objects of at most 30 of them, and the server is near that."""

    __slots__ = (
        "accept_backoff",
        "accept_errors_total",
        "accept_failures",
        "accept_logged_at",
        "budget_bytes",
        "budget_drops",
        "budget_first",
        "budget_logged_at",
        "budget_peak",
        "decoder",
        "inbuf_bytes",
        "input_budget_drops_total",
        "out_total",
        "output_dropped_total",
        "output_paused_total",
        "partial",
        "replies_too_large_total",
        "spin_gate",
    )

    def __init__(self) -> None:
        self.decoder = P.RequestDecoder()
        self.partial: set[Client] = set()  # clients holding part of a frame
        self.inbuf_bytes = 0
        self.out_total = 0  # bytes queued in the OutQueues of all live clients
        self.accept_backoff = ACCEPT_BACKOFF_S
        self.accept_failures = 0  # since the last line logged about them
        self.accept_logged_at = float("-inf")
        self.accept_errors_total = 0
        self.output_paused_total = 0
        self.output_dropped_total = 0
        self.input_budget_drops_total = 0
        # input-budget drops not logged yet: how many, the bytes they held, the first one
        self.budget_drops = 0
        self.budget_bytes = 0
        self.budget_first = ""
        self.budget_peak = 0  # the most the partial frames of all connections held meanwhile
        self.budget_logged_at = float("-inf")
        self.replies_too_large_total = 0
        self.spin_gate = SpinGate()  # whether the loop may poll after traffic (--busy-poll-us)


class NetIO:
    """Mixin of the loop's connection I/O; :class:`infera.kvd.server.Server` provides the state."""

    cfg: DaemonConfig
    sel: selectors.BaseSelector
    clients: dict[int, Client]
    listener: socket.socket | None
    protocol_errors_total: int
    _rbuf: bytearray
    _rview: memoryview

    def _drop(self, client: Client, why: str) -> None:  # provided by Server
        raise NotImplementedError

    def _handle_frame(self, client: Client, body: bytes) -> None:  # provided by Server
        raise NotImplementedError

    _run_slice: Callable[[Client, Sliced], None]  # provided by SliceRunner (no stub: MRO)
    _send_last: Callable[[Client, str, str], None]  # provided by NetOut (no stub: MRO)
    _interest: Callable[[Client], None]  # provided by NetOut (no stub: MRO)

    def _init_netio(self) -> None:
        self.net = NetState()
        self._ready: dict[int, Client] = {}  # clients with frames waiting for a turn, in order
        self._accept_resume_at = 0.0  # when to watch the listener again after a failed accept

    def netio_stats(self) -> dict[str, Any]:
        """This module's counters, for the STATS snapshot. (The loop's tick builds one every
        second: a burst's input-budget drops not logged yet are logged here.)"""
        net = self.net
        if net.budget_drops:
            self._log_budget_drops(time.monotonic())
        return {
            "accept_errors_total": net.accept_errors_total,
            "output_paused_total": net.output_paused_total,
            "output_dropped_total": net.output_dropped_total,
            "input_budget_drops_total": net.input_budget_drops_total,
            "replies_too_large_total": net.replies_too_large_total,
            "busy_poll_yielded_total": net.spin_gate.yielded_total,
            "input_buffered_bytes": net.inbuf_bytes,
            "output_queued_bytes": net.out_total,
        }

    # -- the loop's share ----------------------------------------------------------------------
    def _io_turn(self) -> float:
        """Between two selects: give clients with waiting frames their turn, re-arm the listener
        after an accept back-off. Returns how long the next select may sleep."""
        if self._ready:
            ready, self._ready = self._ready, {}
            for client in ready.values():
                if not client.closed:  # a client may drop another (input budget)
                    self._run_inbox(client)
        wait = 0.0 if self._ready else 0.25
        if self._accept_resume_at:
            left = self._accept_resume_at - time.monotonic()
            if left <= 0:
                self._accept_resume_at = 0.0
                if self.listener is not None:
                    self.sel.register(self.listener, _READ, ("accept", None))
            else:
                wait = min(wait, left)
        return wait

    # -- reading -------------------------------------------------------------------------------
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
        reader = client.reader
        assert reader is not None
        try:
            frames = reader.feed(self._rview[:n])
        except P.FrameTooLarge as exc:
            self.protocol_errors_total += 1
            self._send_last(client, "too_large", str(exc))
            return
        after = reader.pending
        if after or client.inbuf:
            self._account_input(client, after, bool(frames))
            if client.closed:
                return
        if client.inbox:  # frames of an earlier read still wait for their turn: these go after them
            client.inbox.extend(frames)
            self._run_inbox(client)
            return
        n = len(frames)
        if n == 1:  # the common case: one request, one turn
            self._handle_frame(client, frames[0])
            return
        # Several frames (a release riding in front of the next request, a pipelined batch): run
        # them straight from the read, within the turn's bounds; only the rest is queued.
        end = time.monotonic() + TURN_BUDGET_S
        for i in range(n):
            self._handle_frame(client, frames[i])
            if client.closed:
                return
            left = n - i - 1
            # (a big request now being handled in slices sits in the inbox: the rest go after it)
            if left and (
                client.inbox or client.out_paused or i + 1 >= FRAMES_PER_TURN or time.monotonic() > end
            ):
                client.inbox.extend(frames[i + 1 :])
                if not client.out_paused:
                    self._ready[client.id] = client
                self._interest(client)
                return

    def _run_inbox(self, client: Client) -> None:
        """Handle up to FRAMES_PER_TURN waiting frames, fewer if the client's replies pile up."""
        inbox = client.inbox
        n = FRAMES_PER_TURN
        end = time.monotonic() + TURN_BUDGET_S
        while inbox and n and not client.out_paused and not client.closed:
            item = inbox[0]
            if type(item) is Sliced:  # a big request: its next slice (it leaves the inbox when done)
                if item.waiting:
                    break
                self._run_slice(client, item)
            else:
                self._handle_frame(client, inbox.popleft())
            n -= 1
            if time.monotonic() > end:
                break
        if client.closed:
            return
        if inbox and not client.out_paused and not at_front_waiting(inbox):
            self._ready[client.id] = client
        self._interest(client)

    def _account_input(self, client: Client, after: int, completed: bool) -> None:
        """Keep partially received frames of all clients within INPUT_BUDGET_BYTES: over it, drop
        those whose incomplete frame began the longest ago. A parked connection's frame stays old
        however it trickles; a legitimate big request arrives at speed, so its frame is young."""
        net = self.net
        if not client.inbuf or completed:  # the bytes held belong to a frame begun just now
            client.partial_since = time.monotonic()
        net.inbuf_bytes += after - client.inbuf
        client.inbuf = after
        if not after:
            net.partial.discard(client)
            return
        net.partial.add(client)
        if net.inbuf_bytes <= INPUT_BUDGET_BYTES:
            return
        net.budget_peak = max(net.budget_peak, net.inbuf_bytes)
        for victim in sorted(net.partial, key=lambda c: c.partial_since):
            if net.inbuf_bytes <= INPUT_BUDGET_BYTES:
                break
            net.input_budget_drops_total += 1
            if not net.budget_drops:
                net.budget_first = f"{_who(victim)} held {victim.inbuf} bytes"
            net.budget_drops += 1
            net.budget_bytes += victim.inbuf
            self._send_last(victim, "too_large", "over the daemon's input budget")
        self._log_budget_drops(time.monotonic())

    def _log_budget_drops(self, now: float) -> None:
        """One line for the input-budget drops not logged yet, at most once per
        BUDGET_LOG_EVERY_S: how many, who first, and that the total was over the budget (one
        parked connection's few bytes never are; all of them together were)."""
        net = self.net
        if not net.budget_drops or now - net.budget_logged_at < BUDGET_LOG_EVERY_S:
            return
        log.warning(
            "input budget: the partial frames of all connections held %d bytes, over the daemon's "
            "%d-byte input budget; dropped %d connection%s whose frames began the longest ago, "
            "holding %d bytes (the first: %s)",
            net.budget_peak,
            INPUT_BUDGET_BYTES,
            net.budget_drops,
            "" if net.budget_drops == 1 else "s",
            net.budget_bytes,
            net.budget_first,
        )
        net.budget_drops = net.budget_bytes = net.budget_peak = 0
        net.budget_logged_at = now

    def _forget_io(self, client: Client) -> None:
        """A connection going away gives back its share of both budgets (from ``_drop``)."""
        self.net.out_total -= client.out.size
        client.out.size = 0
        if client.inbuf:
            self.net.partial.discard(client)
            self.net.inbuf_bytes -= client.inbuf
            client.inbuf = 0
        self._ready.pop(client.id, None)
        client.inbox.clear()

    # -- accepting -----------------------------------------------------------------------------
    def _accept_failed(self, exc: OSError) -> None:
        """An accept failed: count it; for want of resources, rest the listener for a while."""
        net = self.net
        net.accept_errors_total += 1
        if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
            return  # that one connection is gone; the next may be fine
        net.accept_failures += 1
        now = time.monotonic()
        if now - net.accept_logged_at >= ACCEPT_LOG_EVERY_S:
            log.warning(
                "accept failed (%d times since the last report): %s; new connections wait "
                "%.1f-%.1f s at a time (reported at most once a minute)",
                net.accept_failures,
                exc,
                ACCEPT_BACKOFF_S,
                ACCEPT_BACKOFF_MAX_S,
            )
            net.accept_logged_at = now
            net.accept_failures = 0
        if self.listener is not None and not self._accept_resume_at:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.listener)
            self._accept_resume_at = now + net.accept_backoff
            net.accept_backoff = min(net.accept_backoff * 2, ACCEPT_BACKOFF_MAX_S)

    def _accepted(self) -> None:
        """An accept succeeded: the next failure starts with a short back-off again."""
        self.net.accept_backoff = ACCEPT_BACKOFF_S


def _who(client: Client) -> str:
    return f"client {client.id} (pid {client.info.get('pid', client.peer_pid)})"


def warn_dropped(client: Client, why: str) -> None:
    """Log that a client is being dropped, who it is and why (the caller drops it)."""
    log.warning("%s dropped: %s", _who(client), why)
