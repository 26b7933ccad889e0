"""The client table with more clients than fit: scrolling keeps the header, shows every row."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from textual.pilot import Pilot
from tui_screen import run, screen_text

from infera.bench.top_render import synthetic_stats
from infera.tui.app import TopApp
from infera.tui.table import ClientTable


@contextlib.asynccontextmanager
async def showing(stats: dict[str, Any]) -> AsyncIterator[tuple[TopApp, Pilot]]:
    """``kvd top`` with no daemon, on a 160x48 screen, showing ``stats``."""
    app = TopApp("/nowhere.sock", 1.0, poll=False)
    async with app.run_test(size=(160, 48)) as pilot:
        app.show_stats(stats, 0.0)
        await pilot.pause()
        yield app, pilot


def test_many_clients_scroll_with_page_keys_and_keep_the_header() -> None:
    async def body() -> None:
        async with showing(synthetic_stats(60, 1)) as (app, pilot):
            text = screen_text(app)
            assert "clients (60)" in text
            assert " vllm-engine-0 " in text and " vllm-engine-59 " not in text
            table = app.query_one(ClientTable)
            assert table.has_focus
            for _ in range(6):
                await pilot.press("pagedown")
            await pilot.pause()
            text = screen_text(app)
            assert " vllm-engine-59 " in text and " vllm-engine-0 " not in text
            assert "namespace" in text and "fallback reason" in text  # header still on screen
            await pilot.press("home")
            await pilot.pause()
            assert " vllm-engine-0 " in screen_text(app)

    run(body)


def test_refresh_keeps_the_scroll_position() -> None:
    async def body() -> None:
        async with showing(synthetic_stats(60, 1)) as (app, pilot):
            for _ in range(2):
                await pilot.press("pagedown")
            await pilot.pause()
            before = app.query_one(ClientTable).scroll_y
            assert before > 0
            app.show_stats(synthetic_stats(60, 2), 1.0)
            await pilot.pause()
            assert app.query_one(ClientTable).scroll_y == before

    run(body)


def test_long_cells_are_cut_with_an_ellipsis() -> None:
    async def body() -> None:
        stats = synthetic_stats(1, 1)
        stats["clients"][0]["model"] = "org/" + "x" * 80
        async with showing(stats) as (app, _pilot):
            text = screen_text(app)
            assert "org/xxx" in text and "…" in text and "x" * 80 not in text

    run(body)


def test_odd_fields_and_control_characters_keep_the_dashboard_live() -> None:
    """A wrong-typed field is shown as absent (it was 'DISCONNECTED: cannot show the daemon's
    reply'), and a newline or escape in a client's name neither splits its row nor reaches the
    terminal."""

    async def body() -> None:
        stats = synthetic_stats(3, 1)
        stats["clients"][0]["name"] = "evil\nrow\x1b[2J"
        stats["arena_bytes_used"] = "lots"
        stats["pid"] = "[b]x[/nope]"  # markup in a field is shown as text, never parsed
        stats["tiers"]["long"] = {"backend": "disk", "reconcile": "finished", "reconcile_s": "x"}
        async with showing(stats) as (app, pilot):
            app.show_stats(stats, 1.0)
            await pilot.pause()
            text = screen_text(app)
            assert app.connected and "DISCONNECTED" not in text
            assert "evil\\nrow\\x1b[2J" in text and "pid [b]x[/nope]" in text
            assert not any(line.strip().startswith("row") for line in text.splitlines())

    run(body)
