"""``--probe-isolation --engine URL``: a black-box check that the engine and kvd honour ``cache_salt``.

The probe itself is :mod:`infera.doctor.probe`; this check wires it to the options, the daemon's
counters (``--socket``) and the note on who may map the arena.
"""

from __future__ import annotations

from typing import Any

from infera.doctor.checks.arena_sharing import BOUNDARY, allowed_uids
from infera.doctor.context import Context
from infera.doctor.facts.daemon import daemon as daemon_view
from infera.doctor.model import CheckResult, skip, unknown
from infera.doctor.probe import Engine, Probe
from infera.doctor.registry import check


def daemon_stats_fn(ctx: Context) -> Any:
    """A fresh STATS per call from the daemon the doctor reached (None without one)."""
    view = daemon_view(ctx)
    if view.stats is None or not view.socket:
        return lambda: None
    sock = view.socket

    def stats() -> dict[str, Any] | None:
        from infera.kvd.client import KvdClient, KvdClientError

        try:
            with KvdClient(sock, want_arena=False, role="tool", name="kvd-doctor-probe", timeout=5.0) as c:
                return c.stats()
        except (KvdClientError, OSError):
            return None

    return stats


@check("isolation", "cache_salt isolation probe (--probe-isolation)", "engines", order=90)
def isolation(ctx: Context) -> CheckResult:
    opts = ctx.options
    if not opts.probe_isolation:
        return skip("not asked (kvd doctor --probe-isolation --engine URL sends a few requests to an engine)")
    if not opts.engine:
        return unknown("--probe-isolation needs --engine URL (the engine's OpenAI server)")
    key = ctx.environ.get("VLLM_API_KEY") or ctx.environ.get("OPENAI_API_KEY")
    result = Probe(Engine(opts.engine, api_key=key), daemon_stats_fn(ctx)).run()
    who, many, _ = allowed_uids(ctx)
    if many:
        result.details.append(f"{who} may connect to the daemon: {BOUNDARY} (see arena-sharing)")
    return result
