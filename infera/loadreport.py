"""What an engine's scheduler reports of its load policy, and the one line tools print for it.

The connector's scheduler half (``infera.engine.vllm.scheduler.policy``) sends these counters in
its REPORT; ``kvd stat`` and ``kvd top`` render them with :func:`summary`. A load skipped
because it would be slower than recomputing it is never silent: it is here, per tier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infera.display import count, number

TIERS = ("ram", "disk", "distributed")
POLICIES = ("auto", "always", "never")
# The default loads every hit, as every earlier release did. `auto` is opt-in until an H200 run
# shows its partially loaded hits give vLLM's own tokens (docs/connector.md, "Load policy").
DEFAULT_POLICY = "always"
CHECKS = "load_cost_checks"
SLOWER = "load_skipped_slower_tokens_"  # + tier: hit tokens recomputed, loading judged slower
BY_POLICY = "load_skipped_policy_tokens"  # hit tokens not loaded: INFERA_KVD_LOAD_POLICY=never
PREWARMED = "prewarm_chunks"  # long-tier chunks the scheduler asked the daemon to promote
UNPROMOTED = "prewarm_not_worth_chunks"  # judged slower, but not worth a RAM load either
POLICY = "load_policy_"  # + policy: 1 for the one in use


def summary(counters: Mapping[str, Any]) -> str | None:
    """``load policy auto: recomputed 768 disk tokens (slower than loading), ...``, or None for a
    client that reports no load policy (a worker, a tool, an older connector). A counter that is
    not a number (an odd server's) counts as 0."""
    if CHECKS not in counters:
        return None
    policy = next((p for p in POLICIES if counters.get(POLICY + p)), "?")
    slower = [f"{count(counters.get(SLOWER + t)):,} {t}" for t in TIERS if count(counters.get(SLOWER + t))]
    parts = [f"load policy {policy}: {count(counters.get(CHECKS)):,} hits judged"]
    parts.append(
        f"recomputed (loading slower) {', '.join(slower)} tokens" if slower else "none recomputed as slower"
    )
    if count(counters.get(BY_POLICY)):
        parts.append(f"{count(counters[BY_POLICY]):,} tokens not loaded by policy")
    if count(counters.get(PREWARMED)):
        parts.append(f"{count(counters[PREWARMED]):,} chunks prewarmed")
    if count(counters.get(UNPROMOTED)):
        parts.append(f"{count(counters[UNPROMOTED]):,} chunks left in the long tier (too short to load)")
    rates = [
        f"{t} {rate:,.0f} MB/s"
        for t in TIERS
        if (rate := number(counters.get(f"load_rate_{t}_mbps"))) is not None
    ]
    prefill = number(counters.get("prefill_rate_tps"))
    if prefill is not None:
        rates.append(f"prefill {prefill:,.0f} tokens/s")
    if rates:
        parts.append("rates " + ", ".join(rates))
    return "; ".join(parts)
