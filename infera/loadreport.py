"""What an engine's scheduler reports of its load policy, and the one line tools print for it.

The connector's scheduler half (``infera.engine.vllm.scheduler.policy``) sends these counters in
its REPORT; ``kvd stat`` and ``kvd top`` render them with :func:`summary`. A load skipped
because it would be slower than recomputing it is never silent: it is here, per tier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIERS = ("ram", "disk", "distributed")
POLICIES = ("auto", "always", "never")
# The default loads every hit, as every earlier release did. `auto` is opt-in until an H200 run
# shows its partially loaded hits give vLLM's own tokens (docs/connector.md, "Load policy").
DEFAULT_POLICY = "always"
CHECKS = "load_cost_checks"
SLOWER = "load_skipped_slower_tokens_"  # + tier: hit tokens recomputed, loading judged slower
BY_POLICY = "load_skipped_policy_tokens"  # hit tokens not loaded: INFERA_KVD_LOAD_POLICY=never
PREWARMED = "prewarm_chunks"  # long-tier chunks the scheduler asked the daemon to promote
POLICY = "load_policy_"  # + policy: 1 for the one in use


def summary(counters: Mapping[str, Any]) -> str | None:
    """``load policy auto: recomputed 768 disk tokens (slower than loading), ...``, or None for a
    client that reports no load policy (a worker, a tool, an older connector)."""
    if CHECKS not in counters:
        return None
    policy = next((p for p in POLICIES if counters.get(POLICY + p)), "?")
    slower = [f"{int(counters.get(SLOWER + t, 0)):,} {t}" for t in TIERS if counters.get(SLOWER + t)]
    parts = [f"load policy {policy}: {int(counters.get(CHECKS, 0)):,} hits judged"]
    parts.append(
        f"recomputed (loading slower) {', '.join(slower)} tokens" if slower else "none recomputed as slower"
    )
    if counters.get(BY_POLICY):
        parts.append(f"{int(counters[BY_POLICY]):,} tokens not loaded by policy")
    if counters.get(PREWARMED):
        parts.append(f"{int(counters[PREWARMED]):,} chunks prewarmed")
    rates = [
        f"{t} {counters[f'load_rate_{t}_mbps']:,.0f} MB/s" for t in TIERS if f"load_rate_{t}_mbps" in counters
    ]
    if "prefill_rate_tps" in counters:
        rates.append(f"prefill {counters['prefill_rate_tps']:,.0f} tokens/s")
    if rates:
        parts.append("rates " + ", ".join(rates))
    return "; ".join(parts)
