"""Snapshot of the ``kvd top`` main screen, fed a recorded STATS reply through the live render path.

``data/stats.json`` is a STATS reply recorded from a real daemon with four clients (two engines of
one model that hash differently, one that fell back to POSIX I/O, and kvd-top itself). Its pids,
socket and uptimes were then fixed to stable values, and a ``tiers.long`` section for a degraded
Mooncake tier was written by hand (no L4 backend runs in this test). So were the pin-budget fields
(``pinned_bytes``, ``quota_bytes``, ``quota_refused``, as under ``--client-quota 10``, with the
daemon's warning for vllm-engine-1's 12 refused PUT keys) on every client but vllm-engine-2, whose
row shows a daemon from before pin budgets. The screenshot never changes unless the rendering does.
Update with ``pytest tests/tui --snapshot-update`` after a deliberate change.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from infera.tui.app import TopApp

RECORDED: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "stats.json").read_text())
CHUNK = 200_000


def recorded_frames(n: int = 90) -> list[dict[str, Any]]:
    """The recorded reply as ``n`` one-second refreshes under a made-up but fixed load pattern."""
    frames = []
    gets = sets = hits = 0
    for i in range(n):
        g, st = (i * 37) % 90 + 10, (i * 23) % 40 + 5
        gets, sets, hits = gets + g, sets + st, hits + (2 * g) // 3
        frame = copy.deepcopy(RECORDED)
        frame["gets_total"] = RECORDED["gets_total"] + gets
        frame["hits_total"] = RECORDED["hits_total"] + hits
        frame["misses_total"] = RECORDED["misses_total"] + gets - hits
        frame["sets_total"] = RECORDED["sets_total"] + sets
        frame["bytes_out_total"] = RECORDED["bytes_out_total"] + hits * CHUNK
        frame["bytes_in_total"] = RECORDED["bytes_in_total"] + sets * CHUNK
        frame["tiers"]["ram"].update(hits=frame["hits_total"], misses=frame["misses_total"])
        frame["uptime_s"] = RECORDED["uptime_s"] - (n - 1 - i)
        frames.append(frame)
    return frames


def feed(app: TopApp) -> Any:
    async def run_before(pilot: Pilot) -> None:
        for i, frame in enumerate(recorded_frames()):
            app.show_stats(frame, float(i))
        await pilot.pause()

    return run_before


def test_main_screen(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = TopApp("/run/user/1000/infera-kvd.sock", 1.0, poll=False)
    assert snap_compare(app, terminal_size=(160, 48), run_before=feed(app))


def test_main_screen_narrow_terminal(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = TopApp("/run/user/1000/infera-kvd.sock", 1.0, poll=False)
    assert snap_compare(app, terminal_size=(100, 40), run_before=feed(app))
