"""The scheduler half's load policy: cut each hit to what is worth loading, and count why.

:class:`LoadPolicy` wraps the pure decision of :mod:`.loadcost` with the engine's state: the
policy the environment chose (``INFERA_KVD_LOAD_POLICY``), the cost model fed by the workers'
timings (:mod:`infera.engine.vllm.worker.timing`), and the counters that make every skipped load
visible (the connector's stats, vLLM's ``/metrics``, the daemon's ``kvd stat``): no hit is
recomputed silently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from infera import loadreport as R
from infera.engine.vllm.scheduler.loadcost import POLICIES, TIERS, CostModel, LoadChoice, choose_load
from infera.kvd.client import KvdClientError

log = logging.getLogger("infera.engine.vllm")

COUNTERS = (
    R.CHECKS,
    "load_skipped_requests",
    "load_partial_requests",
    R.BY_POLICY,
    *(R.SLOWER + t for t in TIERS),
    R.PREWARMED,
    "prewarm_errors",
    "timing_load_samples",
    "timing_step_samples",
    "timing_tier_rate_samples",
)


class LoadPolicy:
    """``policy``: ``auto``, ``always`` or ``never``; ``counters``: the scheduler half's own."""

    def __init__(self, policy: str, costs: CostModel, counters: dict[str, int]) -> None:
        if policy not in POLICIES:
            raise ValueError(f"load policy {policy!r} is not one of {POLICIES}")
        self.policy = policy
        self.costs = costs
        self.counters = counters
        for name in COUNTERS:
            counters.setdefault(name, 0)
        self._logged_slower: set[str] = set()

    def cut(
        self, start: int, end: int, chunk_tokens: int, long_chunks: set[int], long_kind: str
    ) -> LoadChoice:
        """What of the hit ``[start, end)`` to load (chunks in ``long_chunks`` only the long tier
        holds, as ``long_kind``); counts the decision."""
        tiers: dict[int, str] = {}
        for c in range(start // chunk_tokens, -(-end // chunk_tokens)):
            tiers[c] = long_kind if c in long_chunks else "ram"
        choice = choose_load(self.policy, start, end, chunk_tokens, tiers, self.costs)
        self.counters[R.CHECKS] += 1
        skipped = sum(choice.skipped.values())
        if not skipped:
            return choice
        self.counters["load_skipped_requests"] += 1
        if choice.load_end > start:
            self.counters["load_partial_requests"] += 1
        if choice.reason == "policy":
            self.counters[R.BY_POLICY] += skipped
            return choice
        for tier, n in choice.skipped.items():
            self.counters[R.SLOWER + tier] += n
            if tier not in self._logged_slower:
                self._logged_slower.add(tier)
                log.info(
                    "infera-kvd: recomputing a %d-token %s hit: loading it would take about %.1f ms, "
                    "recomputing it %.1f ms (counted as load_skipped_slower_tokens_%s; "
                    "INFERA_KVD_LOAD_POLICY=always loads every hit)",
                    n,
                    tier,
                    1000 * choice.load_s,
                    1000 * choice.recompute_s,
                    tier,
                )
        return choice

    def prewarm(
        self, link: Any, keys: list[bytes], per_chunk: list[int], chunks: list[int], long_kind: str
    ) -> None:
        """Ask the daemon (PREWARM, answered at once) to read ``chunks`` from its long tier
        (``long_kind``) into RAM in the background; ``keys``/``per_chunk`` are the request's
        LOOKUP keys. The answer carries the tier's measured read rate, which the cost model
        takes: the one measurement of a tier this policy stopped loading from."""
        starts = [0]
        for n in per_chunk:
            starts.append(starts[-1] + n)
        wanted = [k for c in chunks if c < len(per_chunk) for k in keys[starts[c] : starts[c + 1]]]
        if not wanted:
            return
        try:
            _queued, gbps = link.call(lambda c: c.prewarm_rate(wanted))
        except KvdClientError:
            self.counters["prewarm_errors"] += 1
            return
        self.counters[R.PREWARMED] += len(chunks)
        if gbps is not None:
            self.costs.observe_tier_rate(long_kind, gbps, len(wanted) / len(chunks))
            self.counters["timing_tier_rate_samples"] += 1

    def observe(self, meta: Any, long_kind: str) -> None:
        """Fold the workers' timings of one step (:class:`~infera.engine.vllm.worker.timing.KvdWorkerMeta`)
        into the cost model."""
        chunk_bytes = int(getattr(meta, "chunk_bytes", 0) or 0)
        if chunk_bytes > 0:
            self.costs.chunk_bytes = chunk_bytes
        for chunks, long_chunks, seconds in getattr(meta, "loads", None) or ():
            self.costs.observe_load(int(chunks), {long_kind: int(long_chunks)}, float(seconds))
            self.counters["timing_load_samples"] += 1
        for tokens, seconds in getattr(meta, "steps", None) or ():
            self.costs.observe_step(int(tokens), float(seconds))
            self.counters["timing_step_samples"] += 1

    def report(self) -> Mapping[str, float]:
        """The policy and the rates in use, as numbers for the daemon's REPORT (``kvd stat``)."""
        return {R.POLICY + self.policy: 1, **self.costs.summary()}
