"""``kvd top`` against a real daemon driven by a real client, read off the rendered screen."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from tui_screen import run, screen_text, wait_for

from infera.tui.app import TopApp
from infera.units import format_size

SIZE = (160, 48)
INTERVAL = 0.2


def _row(text: str, label: str) -> list[str]:
    """The cells after ``label`` on the first screen line of the cache panel that starts with it."""
    m = re.search(rf"│ {re.escape(label)}\s+(.+?)\s+│", text)
    assert m, f"no {label!r} row on screen:\n{text}"
    return m.group(1).split()


def _status(text: str) -> str:
    return text.splitlines()[0]


def _fresh_stats(daemon) -> dict:  # type: ignore[no-untyped-def]
    with daemon.client(want_arena=False, role="tool", name="checker") as c:
        return c.stats()


def test_numbers_on_screen_match_stats(daemon) -> None:  # type: ignore[no-untyped-def]
    driver = daemon.client(
        name="driver", role="engine", namespace="ns-a", model="m-1", hash_fingerprint="fp0123456789abcdef"
    )
    driver.report(data_path="posix", fallback=True, fallback_reason="no GPU-direct in this test")
    for i in range(12):
        driver.put(b"key-%d" % i, os.urandom(3000 + i))
    for i in range(20):
        driver.get(b"key-%d" % i)
    driver.lookup([b"key-%d" % i for i in range(16)])
    driver.delete([b"key-0"])
    other = daemon.client(
        name="other", role="engine", namespace="ns-b", model="m-1", hash_fingerprint="fpzzzz"
    )

    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.frames >= 3 and app.connected, what="two live refreshes")
            st = _fresh_stats(daemon)
            await wait_for(pilot, lambda: (app.stats or {}).get("deletes_total") == st["deletes_total"])
            text = screen_text(app)
            ratio = f"{st['hits_total'] / (st['hits_total'] + st['misses_total']):.1%}"
            assert _row(text, "all") == [f"{st['hits_total']:,}", f"{st['misses_total']:,}", ratio]
            ram = st["tiers"]["ram"]
            assert _row(text, "ram")[:2] == [f"{ram['hits']:,}", f"{ram['misses']:,}"]
            assert _row(text, "gets") == [f"{st['gets_total']:,}", "sets", f"{st['sets_total']:,}"]
            assert _row(text, "chunks") == [f"{st['chunks']:,}", "deletes", f"{st['deletes_total']:,}"]
            keys_found = f"{st['lookup_hit_keys_total'] / st['lookup_keys_total']:.1%}"
            assert _row(text, "lookups") == [f"{st['lookups_total']:,}", "keys", "found", keys_found]
            used = format_size(st["arena_bytes_used"])
            assert f"{used} of {format_size(st['arena_bytes_capacity'])}" in text
            assert f"pid {st['pid']}" in _status(text)
            assert f"evictions     {st['evictions_total']}" in text
            line = next(ln for ln in text.splitlines() if " driver " in ln)
            for cell in (str(os.getpid()), "engine", "ns-a", "m-1", "fp0123456789", "posix (fallback)"):
                assert cell in line
            assert "no GPU-direct in this test" in line
            assert "fell back to posix: no GPU-direct in this test" in text
            assert "engines of model m-1 disagree on hash settings" in text
            assert "Traceback" not in text

    try:
        run(body)
    finally:
        driver.close()
        other.close()


def test_rates_and_sparklines_follow_traffic(daemon) -> None:  # type: ignore[no-untyped-def]
    driver = daemon.client(name="driver")

    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.connected)
            for i in range(30):
                driver.put(b"r-%d" % i, b"x" * 10_000)
                await pilot.pause(0.02)
            await wait_for(pilot, lambda: (app.stats or {}).get("sets_total") == 30)
            await pilot.pause(2 * INTERVAL)
            series = list(app.history.series["sets"])
            assert max(series) > 0
            text = screen_text(app)
            peak = re.search(r"sets/s .*\n.*│ peak\s+(\S+)/s", text)
            assert peak and float(peak.group(1).rstrip("kM")) > 0
            assert re.search(r"sets/s\s+0\.0/s", text), "rate should drop to zero once traffic stops"
            assert any(ch in text for ch in "▂▃▄▅▆▇█")

    try:
        run(body)
    finally:
        driver.close()


def test_pause_freezes_the_screen_and_resume_catches_up(daemon) -> None:  # type: ignore[no-untyped-def]
    driver = daemon.client(name="driver")
    for i in range(5):
        driver.put(b"p-%d" % i, b"y" * 100)

    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: _row(screen_text(app), "gets")[2] == "5")
            await pilot.press("p")
            await wait_for(pilot, lambda: "PAUSED" in _status(screen_text(app)))
            for i in range(5, 12):
                driver.put(b"p-%d" % i, b"y" * 100)
            await pilot.pause(5 * INTERVAL)
            assert _row(screen_text(app), "gets")[2] == "5"
            await pilot.press("p")
            await wait_for(pilot, lambda: _row(screen_text(app), "gets")[2] == "12", what="resume")
            assert "PAUSED" not in _status(screen_text(app))

    try:
        run(body)
    finally:
        driver.close()


def _order(text: str, names: list[str]) -> list[str]:
    lines = text.splitlines()
    found = {n: next(i for i, ln in enumerate(lines) if f" {n} " in ln) for n in names}
    return sorted(names, key=found.__getitem__)


def test_sort_key_cycles_the_client_table(daemon) -> None:  # type: ignore[no-untyped-def]
    specs = [("charlie", "ns-x", "engine"), ("alpha", "ns-z", "worker"), ("bravo", "ns-y", "admin")]
    clients = [daemon.client(name=n, namespace=ns, role=r, want_arena=False) for n, ns, r in specs]
    for i, c in enumerate(clients):  # different request counts: bravo most, then alpha, charlie
        for _ in range([1, 5, 9][i]):
            c.ping()
    names = [n for n, _ns, _r in specs]

    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: "clients (4)" in screen_text(app))
            assert _order(screen_text(app), names) == ["charlie", "alpha", "bravo"]  # connect order
            expected = {
                "name": ["alpha", "bravo", "charlie"],
                "role": ["bravo", "charlie", "alpha"],
                "namespace": ["charlie", "bravo", "alpha"],
                "data path": None,
                "requests": ["bravo", "alpha", "charlie"],
                "pinned": ["charlie", "alpha", "bravo"],  # none pins anything: then pid (one here), id
                "pid": ["charlie", "alpha", "bravo"],
            }
            for key, order in expected.items():
                await pilot.press("s")
                await wait_for(pilot, lambda k=key: f"sorted by {k} " in screen_text(app), what=key)
                if order is not None:
                    assert _order(screen_text(app), names) == order, key

    try:
        run(body)
    finally:
        for c in clients:
            c.close()


def test_help_key_opens_and_closes_help(daemon) -> None:  # type: ignore[no-untyped-def]
    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.connected)
            assert "cycle the client-table sort" not in screen_text(app)
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: "cycle the client-table sort" in screen_text(app))
            await pilot.press("escape")
            await wait_for(pilot, lambda: "cycle the client-table sort" not in screen_text(app))
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: "cycle the client-table sort" in screen_text(app))
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: "cycle the client-table sort" not in screen_text(app))

    run(body)


def test_quit_key_exits_with_status_zero(daemon) -> None:  # type: ignore[no-untyped-def]
    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.connected)
            await pilot.press("q")
            await pilot.pause(0.1)
            assert not app.is_running
        assert app.return_code == 0

    run(body)


def test_daemon_killed_and_restarted_while_watching(start_daemon) -> None:  # type: ignore[no-untyped-def]
    d = start_daemon("--max-bytes", "16M", name="restart")

    async def body() -> None:
        app = TopApp(d.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: f"pid {d.pid}" in _status(screen_text(app)))
            old_pid = d.pid
            d.kill()
            await wait_for(pilot, lambda: "DISCONNECTED" in _status(screen_text(app)), what="disconnect")
            await pilot.pause(3 * INTERVAL)  # several failed reconnects must not crash or flood
            assert app.is_running and "DISCONNECTED" in _status(screen_text(app))
            d.start()
            await wait_for(pilot, lambda: f"pid {d.pid}" in _status(screen_text(app)), what="reconnect")
            text = screen_text(app)
            assert d.pid != old_pid
            assert "live" in _status(text) and "DISCONNECTED" not in _status(text)
            assert "Traceback" not in text

    run(body)


def test_ui_stays_responsive_while_the_daemon_hangs(daemon) -> None:  # type: ignore[no-untyped-def]
    """A stopped daemon makes the STATS call hang; keys must still work (the call is off the UI thread)."""

    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL, timeout=3.0)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.connected)
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                await pilot.pause(3 * INTERVAL)
                started = time.monotonic()
                await pilot.press("question_mark")
                await wait_for(pilot, lambda: "cycle the client-table sort" in screen_text(app), timeout=2.0)
                assert time.monotonic() - started < 1.5
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
            await pilot.press("escape")

    run(body)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_other_terminal_sizes_render_without_error(daemon, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.connected and "live" in _status(screen_text(app)))

    run(body)


def test_no_daemon_at_start_says_so_and_shows_no_made_up_zeros(short_tmp, start_daemon) -> None:  # type: ignore[no-untyped-def]
    sock = str(short_tmp / "late.sock")

    async def body() -> None:
        app = TopApp(sock, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: "DISCONNECTED" in _status(screen_text(app)))
            text = screen_text(app)
            assert "socket file not found" in _status(text)
            assert "no data yet: waiting for the daemon" in text
            assert "│ all " not in text
            d = start_daemon("--max-bytes", "16M", name="late")
            assert d.socket == sock
            await wait_for(pilot, lambda: f"pid {d.pid}" in _status(screen_text(app)), what="late daemon")
            assert "no data yet" not in screen_text(app)

    run(body)


def test_long_tier_panel_matches_stats(start_daemon, short_tmp) -> None:  # type: ignore[no-untyped-def]
    (short_tmp / "long").mkdir()
    d = start_daemon(
        "--max-bytes", "8M", "--long-path", str(short_tmp / "long"), "--long-bytes", "32M", name="long"
    )
    driver = d.client(name="driver")
    for i in range(12):
        driver.put(b"l-%d" % i, os.urandom(1 << 20))
    for i in range(12):
        driver.get(b"l-%d" % i)

    async def body() -> None:
        app = TopApp(d.socket, INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.connected and "disk (L3)" in screen_text(app))
            long = _fresh_stats(d)["tiers"]["long"]
            await wait_for(
                pilot,
                lambda: (app.stats or {}).get("tiers", {}).get("long", {}).get("chunks") == long["chunks"],
            )
            text = screen_text(app)
            assert re.search(rf"│ chunks\s+{long['chunks']:,}\s+│", text)  # the long panel's row
            assert f"{format_size(long['bytes_used'])} of {format_size(long['capacity'])}" in text
            assert _row(text, "long")[:2] == [f"{long['hits']:,}", f"{long['misses']:,}"]
            assert re.search(rf"state\s+{long['state']}", text)

    try:
        run(body)
    finally:
        driver.close()


def test_quit_while_the_daemon_hangs_does_not_wait_for_the_stuck_call(daemon) -> None:  # type: ignore[no-untyped-def]
    pressed: list[float] = []

    async def body() -> None:
        app = TopApp(daemon.socket, INTERVAL, timeout=8.0)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.connected)
            os.kill(daemon.pid, signal.SIGSTOP)
            await pilot.pause(3 * INTERVAL)
            assert app._polling, "a STATS call should be stuck in flight"
            pressed.append(time.monotonic())
            await pilot.press("q")

    try:
        run(body)
        assert time.monotonic() - pressed[0] < 4.0  # well under the 8 s socket timeout
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
