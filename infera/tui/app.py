"""The ``kvd top`` Textual application.

The socket call never runs on the UI thread: a timer starts one polling thread per refresh, and
the thread posts either :class:`StatsArrived` or :class:`PollFailed` back (``post_message`` is
thread-safe). Everything the screen shows goes through :meth:`TopApp.show_stats`, so tests and the
render benchmark can feed a recorded STATS map through exactly the path live data takes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Sparkline, Static

from infera.display import printable
from infera.tui import clients, panels
from infera.tui.model import (
    DEFAULT_WINDOW_S,
    SERIES,
    SORT_ORDER,
    History,
    Sample,
    format_duration,
    format_rate,
    next_sort,
)
from infera.tui.table import ClientTable

HELP = """\
[b]kvd top[/b]: live counters of one kvd daemon

[b]q[/b]   quit
[b]p[/b]   pause / resume refreshing (the daemon is not polled while paused)
[b]s[/b]   cycle the client-table sort: pid, name, role, namespace, data path, requests, pinned
[b]?[/b]   this help (escape closes it)
arrows / page keys scroll the client table

[b]cache[/b]      hits, misses and hit ratio, overall and per tier ([i]recent[/i]: since the last refresh)
[b]rates[/b]      per second, from the difference between two refreshes; sparklines and peaks cover
           the last few minutes of the running daemon (a daemon restart starts them afresh)
[b]capacity[/b]   fill of the RAM arena and the long tier
[b]health[/b]     evictions, expiries, refused puts; corrupt chunks, failed and dropped writes
[b]long tier[/b]  backend (L3 disk, L4 mooncake / lmcache), its state and what it reports
[b]clients[/b]    every process connected; yellow rows fell back to a slower data path;
           [i]pinned[/i]: bytes kept from eviction, % of its pin quota (! if it refused PUTs)
[b]warnings[/b]   what the daemon flags (e.g. engines of one model that hash differently)
"""


class StatsArrived(Message):
    """A STATS reply, with the monotonic time it arrived."""

    def __init__(self, stats: dict[str, Any], at: float) -> None:
        super().__init__()
        self.stats = stats
        self.at = at


class PollFailed(Message):
    """The daemon could not be reached or answered badly; ``reason`` is one line for users."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class HelpScreen(ModalScreen[None]):
    """Keys and what each panel means."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", key_display="?"),
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > #help { width: 100; max-width: 95%; height: auto; border: thick $primary;
                         background: $surface; padding: 1 2; }
    """

    def compose(self) -> ComposeResult:
        body = Static(HELP, id="help")
        body.border_title = "help"
        yield body

    def action_close(self) -> None:
        self.dismiss(None)


class TopApp(App[int]):
    """Dashboard of one daemon. ``poll=False`` shows only what :meth:`show_stats` is given."""

    TITLE = "kvd top"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("s", "sort", "Sort clients"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012 - typed by App
    CSS = """
    #status { dock: top; height: 1; background: $panel; }
    #body { height: 1fr; }
    .box { border: round $primary; padding: 0 1; }
    Screen.-stale .box { border: round $error; }
    #row1 { height: 12; }
    #cache { width: 52; height: 100%; }
    #rates { width: 1fr; height: 100%; }
    #rates-note { height: 1; }
    .rate { height: 2; }
    .rate-label { width: 30; }
    .rate Sparkline { width: 1fr; height: 2; }
    #row2 { height: auto; }
    #left2 { width: 1fr; height: auto; }
    #capacity, #health { height: auto; }
    #long { width: 1fr; height: auto; min-height: 8; }
    #clients { height: 1fr; min-height: 8; }
    #warnings { height: auto; max-height: 8; }
    Screen.-narrow #row1, Screen.-narrow #row2 { layout: vertical; height: auto; }
    Screen.-narrow #cache, Screen.-narrow #rates, Screen.-narrow #left2, Screen.-narrow #long {
        width: 100%; height: auto; min-height: 0;
    }
    Screen.-narrow .rate-label { width: 28; }
    Screen.-narrow #clients { height: 14; }
    """

    paused: reactive[bool] = reactive(False)
    sort: reactive[str] = reactive(SORT_ORDER[0])

    def __init__(
        self,
        socket: str,
        interval: float = 1.0,
        *,
        poll: bool = True,
        window_s: float = DEFAULT_WINDOW_S,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.socket = socket
        self.interval = interval
        self.poll = poll
        self.timeout = timeout if timeout is not None else max(1.0, min(5.0, 2 * interval))
        self.history = History.for_window(interval, window_s)
        self.stats: dict[str, Any] | None = None
        self.sample: Sample | None = None
        self.connected = False
        self.reason = "connecting"
        self.last_seen = ""
        self.frames = 0
        self._polling = False
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._shown = False
        self._statics: dict[str, Static] = {}
        self._shapes: dict[str, object] = {}

    # -- layout -----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with VerticalScroll(id="body"):
            yield from self._compose_body()
        yield Footer()

    def _compose_body(self) -> ComposeResult:
        with Horizontal(id="row1"):
            yield Static(id="cache", classes="box")
            with Vertical(id="rates", classes="box"):
                for name in SERIES:
                    with Horizontal(classes="rate"):
                        yield Static(id=f"rate-{name}", classes="rate-label")
                        yield Sparkline([], id=f"spark-{name}")
                yield Static(id="rates-note")
        with Horizontal(id="row2"):
            with Vertical(id="left2"):
                yield Static(id="capacity", classes="box")
                yield Static(id="health", classes="box")
            yield Static(id="long", classes="box")
        yield ClientTable(clients.CLIENT_COLUMNS, clients.RIGHT_ALIGNED, id="clients", classes="box")
        yield Static(id="warnings", classes="box")

    @property
    def main(self) -> Screen[Any]:
        """The dashboard screen (queries go here even while the help screen is on top)."""
        return self.screen_stack[0]

    def on_mount(self) -> None:
        for wid, title in (
            ("cache", "cache"),
            ("rates", "rates"),
            ("capacity", "capacity"),
            ("health", "health"),
            ("long", "long tier"),
            ("warnings", "warnings"),
        ):
            self.main.query_one(f"#{wid}").border_title = title
        self.main.query_one(ClientTable).focus(scroll_visible=False)
        self._shown = True
        self.render_all()
        if self.poll:
            self.set_interval(self.interval, self._tick)
            self._tick()

    # -- polling (worker thread) ------------------------------------------------------------
    def _tick(self) -> None:
        if self.paused or self._polling or not self._live:
            return
        self._polling = True
        # A daemon thread rather than a Textual thread worker: those run in asyncio's default
        # executor, which is joined at exit, so quitting while the daemon hangs would wait out
        # the socket timeout.
        threading.Thread(target=self._poll, name="kvd-top-poll", daemon=True).start()

    def _poll(self) -> None:
        """Runs on a worker thread: one STATS round trip, reconnecting when needed."""
        from infera.kvd.client import KvdClient, KvdClientError

        with self._client_lock:
            try:
                if self._client is None:
                    self._client = KvdClient(
                        self.socket, want_arena=False, role="tool", name="kvd-top", timeout=self.timeout
                    )
                stats = self._client.stats()
            except KvdClientError as err:
                self._drop_client()
                self.post_message(PollFailed(err.message))
                return
            except Exception as exc:  # never let a surprise become a traceback on screen
                self._drop_client()
                self.post_message(PollFailed(f"{type(exc).__name__}: {exc}"))
                return
        self.post_message(StatsArrived(stats, time.monotonic()))

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    @property
    def _live(self) -> bool:
        """True while the dashboard screen exists (messages can still arrive while quitting)."""
        return self._shown and bool(self.screen_stack)

    def on_stats_arrived(self, message: StatsArrived) -> None:
        self._polling = False
        if self._live and not self.paused:
            try:
                self.show_stats(message.stats, message.at)
            except Exception as exc:  # a reply this version cannot draw: say so, keep running
                self.connected = False
                self.reason = f"cannot show the daemon's reply ({type(exc).__name__}: {exc})"
                self.render_status()

    def on_poll_failed(self, message: PollFailed) -> None:
        self._polling = False
        if self.paused or not self._live:
            return
        if self.connected or self.reason != message.reason:
            self.connected = False
            self.reason = message.reason
            self.main.add_class("-stale")
            self.render_status()

    def on_unmount(self) -> None:
        self._shown = False
        if self._client_lock.acquire(timeout=0.2):
            try:
                self._drop_client()
            finally:
                self._client_lock.release()

    # -- rendering --------------------------------------------------------------------------
    def show_stats(self, stats: Mapping[str, Any], now: float) -> None:
        """Take one STATS reply (live or recorded) and redraw every panel from it."""
        was_connected = self.connected
        self.sample = self.history.add(stats, now)
        self.stats = dict(stats)
        self.connected = True
        self.reason = ""
        self.last_seen = time.strftime("%H:%M:%S")
        self.main.remove_class("-stale")
        if not was_connected and self.frames and self.poll:
            self.notify(f"connected to kvd pid {printable(stats.get('pid', '?'))}", timeout=3, markup=False)
        self.render_all()

    def _put(self, wid: str, content: Any, shape: object = None) -> None:
        """Update one Static; ask for a new layout only when its shape (line count) may differ."""
        widget = self._statics.get(wid)
        if widget is None:
            widget = self._statics[wid] = self.main.query_one(f"#{wid}", Static)
        widget.update(content, layout=self._shapes.get(wid, ...) != shape)
        self._shapes[wid] = shape

    def render_status(self) -> None:
        status = panels.status_line(
            self.stats,
            self.socket,
            connected=self.connected,
            reason=self.reason,
            paused=self.paused,
            interval=self.interval,
            last_seen=self.last_seen,
        )
        self._put("status", status)

    def render_all(self) -> None:
        self.frames += 1
        if self.stats is None:
            self.render_waiting()
            return
        stats: Mapping[str, Any] = self.stats
        long = panels.long_tier(stats)
        self.render_status()
        self._put("cache", panels.cache_table(stats, self.sample))
        rates = self.sample.rates if self.sample else {}
        for name, (_counter, label, is_bytes) in SERIES.items():
            series = list(self.history.series[name])
            value = format_rate(rates[name], is_bytes) if name in rates else "–"
            peak = format_rate(max(series), is_bytes) if series else "–"
            self._put(f"rate-{name}", f"[b]{label:<10}[/b] {value:>14}\n[dim]{'peak':<10} {peak:>14}[/dim]")
            spark = self.main.query_one(f"#spark-{name}", Sparkline)
            # One column per refresh, newest on the right: fewer points than columns would
            # otherwise be stretched across the whole width.
            spark.data = [0.0] * (spark.size.width - len(series)) + series
        span = self.history.span_s(self.interval)
        self._put(
            "rates-note",
            f"[dim]sparklines: last {format_duration(span)} at one point per {self.interval:g}s[/dim]",
        )
        self._put("capacity", panels.capacity_text(stats), long is None)
        self._put("health", panels.health_table(stats), long is None)
        long_shape = (tuple(long), len(str(long.get("last_error") or ""))) if long else None
        self._put("long", panels.long_table(stats), long_shape)
        self.render_clients()
        warnings = panels.warning_lines(stats)
        self._put("warnings", panels.warnings_text(stats), tuple(len(w) for w in warnings))

    def render_waiting(self) -> None:
        """Before the first reply: say so instead of showing zeros that were never measured."""
        self.render_status()
        waiting = "[dim]no data yet: waiting for the daemon[/dim]"
        for wid in ("cache", "capacity", "health", "long", "warnings"):
            self._put(wid, waiting, "waiting")
        for name, (_counter, label, _bytes) in SERIES.items():
            self._put(f"rate-{name}", f"[b]{label:<10}[/b] {'–':>14}\n[dim]{'peak':<10} {'–':>14}[/dim]")
        self._put("rates-note", "")
        self.render_clients()

    def render_clients(self) -> None:
        table = self.main.query_one(ClientTable)
        rows = clients.client_rows(self.stats or {}, self.sort)
        table.border_title = f"clients ({len(rows)}), sorted by {self.sort} (s to change)"
        table.set_rows(rows)

    # -- keys -------------------------------------------------------------------------------
    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        if self._live:
            self.render_status()
        if not paused and self.poll and self._live:
            self._tick()

    def action_sort(self) -> None:
        self.sort = next_sort(self.sort)

    def watch_sort(self) -> None:
        if self._live:
            self.render_clients()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


__all__ = ["HelpScreen", "PollFailed", "StatsArrived", "TopApp"]
