"""``kvd bench top-render``: how long ``kvd top`` takes to draw one frame.

A frame is what happens once per refresh: :meth:`TopApp.show_stats` with a new STATS reply, the
messages it causes, the layout pass, the compositor update, then a full repaint of the screen into
an in-memory terminal (the cost of a redraw after a resize). It is measured headless at 160x48 with
a STATS reply of ``clients`` clients whose counters change every frame (so the client table is
rebuilt each time, the worst case) and ``history`` points in every sparkline series. There is no
natural baseline for a render time, so the result is printed against the 50 ms budget and next to
an empty frame (no clients, no history) measured in the same run.
"""

from __future__ import annotations

import asyncio
import io
import json
import statistics
import time
from typing import Any

from infera.tui.model import SERIES, History

BUDGET_MS = 50.0
SIZE = (160, 48)


def synthetic_stats(clients: int, frame: int) -> dict[str, Any]:
    """A STATS reply as a busy daemon would send it; counters grow with ``frame``."""
    gets = 1000 * frame
    rows = []
    for i in range(clients):
        fallback = i % 17 == 0
        rows.append(
            {
                "id": i + 1,
                "pid": 10_000 + i,
                "name": f"vllm-engine-{i}",
                "role": "engine" if i % 5 else "tool",
                "model": f"org/model-{i % 4}",
                "namespace": f"ns-{i % 7}",
                "hash_fingerprint": f"{i * 2654435761 % (1 << 64):016x}",
                "data_path": "posix" if fallback else "arena",
                "fallback": fallback,
                "fallback_reason": "GPU-direct unavailable: no /dev/kfd" if fallback else None,
                "requests": (i * 31 + frame * 7) % 100_000,
                "leases": i % 3,
                "connected_s": 3600 - i,
            }
        )
    return {
        "version": "bench",
        "pid": 1,
        "uptime_s": 3600 + frame,
        "gets_total": gets,
        "sets_total": gets // 3,
        "hits_total": gets * 2 // 3,
        "misses_total": gets - gets * 2 // 3,
        "bytes_in_total": gets * 65536 // 3,
        "bytes_out_total": gets * 65536 * 2 // 3,
        "chunks": 5000,
        "arena_bytes_used": 3 << 30,
        "arena_bytes_capacity": 4 << 30,
        "clients_connected": clients,
        "clients": rows,
        "warnings": [f"engines of model org/model-{m} disagree on hash settings" for m in range(2)],
        "tiers": {
            "ram": {"hits": gets * 2 // 3, "misses": gets - gets * 2 // 3},
            "long": {
                "backend": "mooncake",
                "state": "ready",
                "chunks": 90_000,
                "bytes_used": 300 << 30,
                "capacity": 1 << 40,
                "hits": frame,
                "misses": frame,
                "latency_ms": {"get_p50": 0.9, "get_p99": 3.2},
            },
        },
    }


async def _measure(clients: int, history: int, frames: int) -> tuple[list[float], list[float]]:
    from rich.console import Console

    from infera.tui.app import TopApp

    app = TopApp("/bench/kvd.sock", 1.0, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        app.history = History(max(2, history))
        if history:
            for name in SERIES:
                app.history.extend(name, ((i * 7919) % 1000 for i in range(history)))
        times, cpu = [], []
        for frame in range(frames + 3):  # the first frames pay for first-time layout; drop them
            stats = synthetic_stats(clients, frame) if clients or history else {}
            start, start_cpu = time.perf_counter(), time.process_time()
            app.show_stats(stats, float(frame))
            await pilot._wait_for_screen()
            app.screen._on_timer_update()
            console = Console(width=SIZE[0], height=SIZE[1], file=io.StringIO(), force_terminal=True)
            console.print(app.screen._compositor.render_update(full=True))
            if frame >= 3:
                times.append((time.perf_counter() - start) * 1000)
                cpu.append((time.process_time() - start_cpu) * 1000)
    return times, cpu


def run_top_render_bench(
    clients: int = 200, history: int = 10_000, frames: int = 20, json_out: bool = False
) -> dict[str, Any]:
    """Measure the full frame and the empty baseline in one run; print and return the figures."""
    from infera.bench.args import at_least

    at_least(clients, "--clients", 0)
    at_least(history, "--history", 0)
    at_least(frames, "--frames")
    try:
        import textual  # noqa: F401
    except ImportError:
        from infera.errors import KvdError
        from infera.tui.cli import INSTALL_HINT

        raise KvdError("this benchmark renders kvd top, which needs Textual", hint=INSTALL_HINT) from None
    empty, empty_cpu = asyncio.run(_measure(0, 0, frames))
    full, full_cpu = asyncio.run(_measure(clients, history, frames))
    result: dict[str, Any] = {
        "clients": clients,
        "history_points": history,
        "frames": frames,
        "terminal": f"{SIZE[0]}x{SIZE[1]}",
        "frame_ms_median": round(statistics.median(full), 2),
        "frame_ms_max": round(max(full), 2),
        "frame_cpu_ms_median": round(statistics.median(full_cpu), 2),
        "empty_frame_ms_median": round(statistics.median(empty), 2),
        "empty_frame_cpu_ms_median": round(statistics.median(empty_cpu), 2),
        "budget_ms": BUDGET_MS,
    }
    result["ratio_to_budget"] = round(result["frame_ms_median"] / BUDGET_MS, 3)
    result["ratio_to_empty"] = round(
        result["frame_ms_median"] / max(result["empty_frame_ms_median"], 1e-6), 2
    )
    if json_out:
        print(json.dumps(result, sort_keys=True))
        return result
    print(f"kvd top frame render, {result['terminal']} headless, {frames} frames each (median)")
    print(
        f"  empty frame (baseline):  {result['empty_frame_ms_median']:8.2f} ms"
        f"  (CPU {result['empty_frame_cpu_ms_median']:.2f} ms)"
    )
    print(
        f"  {clients} clients, {history:,}-point history: {result['frame_ms_median']:8.2f} ms"
        f"  (CPU {result['frame_cpu_ms_median']:.2f} ms, max wall {result['frame_ms_max']:.2f} ms)"
        f"  = {result['ratio_to_empty']:.1f}x the empty frame"
    )
    verdict = "within" if result["ratio_to_budget"] <= 1 else "OVER"
    print(f"  ratio to the {BUDGET_MS:.0f} ms budget: {result['ratio_to_budget']:.2f} ({verdict} budget)")
    return result


__all__ = ["run_top_render_bench", "synthetic_stats"]
