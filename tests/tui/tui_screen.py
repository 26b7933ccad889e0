"""Helpers for pilot tests: read what a running Textual app shows, wait for it to change."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable

from rich.console import Console
from textual.app import App
from textual.pilot import Pilot


def screen_text(app: App) -> str:
    """The characters on the app's screen right now, one line per terminal row."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False)
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    console.print(update)
    return console.export_text(styles=False)


async def wait_for(
    pilot: Pilot, predicate: Callable[[], bool], timeout: float = 10.0, what: str = ""
) -> None:
    """Let the app run until ``predicate()`` holds; fail with the screen contents if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if predicate():
            return
    raise AssertionError(f"timed out waiting for {what or predicate}; screen:\n{screen_text(pilot.app)}")


def run(coro_fn: Callable[[], object]) -> None:
    """Run an async test body on a fresh event loop (no pytest-asyncio here)."""
    asyncio.run(coro_fn())  # type: ignore[arg-type]
