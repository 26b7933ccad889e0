"""The ``kvd top`` Textual application.

The socket call never runs on the UI thread: a timer starts one thread worker per refresh, and the
worker posts either :class:`StatsArrived` or :class:`PollFailed` back (``post_message`` is
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
from textual.widgets import DataTable, Footer, Sparkline, Static

from infera.tui import panels
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

HELP = """\
[b]kvd top[/b]: live counters of one kvd daemon

[b]q[/b]   quit
[b]p[/b]   pause / resume refreshing (the daemon is not polled while paused)
[b]s[/b]   cycle the client-table sort: pid, name, role, namespace, data path, requests
[b]?[/b]   this help (escape closes it)
arrows / page keys move through the client table

[b]cache[/b]      hits, misses and hit ratio overall and per tier; [i]recent[/i] covers the last refresh only
[b]rates[/b]      per second, from the difference between two refreshes; sparklines cover the last
           few minutes (the window restarts when the daemon restarts)
[b]capacity[/b]   fill of the RAM arena and the long tier
[b]health[/b]     evictions, expiries, refused puts; corrupt chunks, failed and dropped writes
[b]long tier[/b]  backend (L3 disk, L4 mooncake / lmcache), its state and what it reports
[b]clients[/b]    every process connected; yellow rows fell back to a slower data path
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
        self._table_rows: list[tuple[str, list[str]]] = []
        self._shown = False

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
        yield DataTable(id="clients", classes="box", cursor_type="row", zebra_stripes=True)
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
        table = self.main.query_one("#clients", DataTable)
        for col in panels.CLIENT_COLUMNS:
            table.add_column(col, key=col)
        self._shown = True
        self.render_all()
        if self.poll:
            self.set_interval(self.interval, self._tick)
            self._tick()

    # -- polling (worker thread) ------------------------------------------------------------
    def _tick(self) -> None:
        if self.paused or self._polling:
            return
        self._polling = True
        self.run_worker(self._poll, thread=True, group="poll", exit_on_error=False)

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

    def on_stats_arrived(self, message: StatsArrived) -> None:
        self._polling = False
        if not self.paused:
            self.show_stats(message.stats, message.at)

    def on_poll_failed(self, message: PollFailed) -> None:
        self._polling = False
        if self.paused:
            return
        if self.connected or self.reason != message.reason:
            self.connected = False
            self.reason = message.reason
            self.main.add_class("-stale")
            self.render_status()

    def on_unmount(self) -> None:
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
            self.notify(f"connected to kvd pid {stats.get('pid', '?')}", timeout=3)
        self.render_all()

    def render_status(self) -> None:
        self.main.query_one("#status", Static).update(
            panels.status_line(
                self.stats,
                self.socket,
                connected=self.connected,
                reason=self.reason,
                paused=self.paused,
                interval=self.interval,
                last_seen=self.last_seen,
            )
        )

    def render_all(self) -> None:
        self.frames += 1
        stats: Mapping[str, Any] = self.stats or {}
        self.render_status()
        self.main.query_one("#cache", Static).update(panels.cache_table(stats, self.sample))
        rates = self.sample.rates if self.sample else {}
        for name, (_counter, label, is_bytes) in SERIES.items():
            series = list(self.history.series[name])
            value = format_rate(rates[name], is_bytes) if name in rates else "–"
            peak = format_rate(max(series), is_bytes) if series else "–"
            self.main.query_one(f"#rate-{name}", Static).update(
                f"[b]{label:<10}[/b] {value:>14}\n[dim]{'peak':<10} {peak:>14}[/dim]"
            )
            self.main.query_one(f"#spark-{name}", Sparkline).data = series
        span = self.history.span_s(self.interval)
        self.main.query_one("#rates-note", Static).update(
            f"[dim]sparklines: last {format_duration(span)} at one point per {self.interval:g}s[/dim]"
        )
        self.main.query_one("#capacity", Static).update(panels.capacity_text(stats))
        self.main.query_one("#health", Static).update(panels.health_table(stats))
        self.main.query_one("#long", Static).update(panels.long_table(stats))
        self.render_clients()
        self.main.query_one("#warnings", Static).update(panels.warnings_text(stats))

    def render_clients(self) -> None:
        stats: Mapping[str, Any] = self.stats or {}
        table = self.main.query_one("#clients", DataTable)
        rows = panels.client_rows(stats, self.sort)
        table.border_title = f"clients ({len(rows)}), sorted by {self.sort} (s to change)"
        plain = [(key, [c.plain for c in cells]) for key, cells in rows]
        if plain == self._table_rows:
            return
        self._table_rows = plain
        keep = None
        if table.row_count and table.cursor_row < table.row_count:
            keep = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        if keep is not None and keep in table.rows:
            table.move_cursor(row=table.get_row_index(keep), animate=False)

    # -- keys -------------------------------------------------------------------------------
    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        if self._shown:
            self.render_status()
        if not paused and self.poll and self._shown:
            self._tick()

    def action_sort(self) -> None:
        self.sort = next_sort(self.sort)

    def watch_sort(self) -> None:
        if self._shown:
            self.render_clients()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


__all__ = ["HelpScreen", "PollFailed", "StatsArrived", "TopApp"]
