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
    R.UNPROMOTED,
    "prewarm_errors",
    "timing_load_samples",
    "timing_step_samples",
    "timing_tier_rate_samples",
    "timing_long_rates_reset",
    "load_probe_requests",
)

# RAM hits judged slower than recompute are loaded anyway (to time them) while the RAM rate rests
# on fewer loads than this, at most this many times per engine, and only when the estimate is
# within PROBE_MAX_RATIO of the recompute estimate (what a wrong guess can cost).
PROBE_SAMPLES = 3
PROBE_MAX_RATIO = 2.0


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
        self._probes = 0

    def cut(
        self,
        start: int,
        end: int,
        chunk_tokens: int,
        long_chunks: set[int],
        long_kind: str,
        prompt_tokens: int = 0,
    ) -> LoadChoice:
        """What of the hit ``[start, end)`` of a ``prompt_tokens``-token prompt to load (chunks in
        ``long_chunks`` only the long tier holds, as ``long_kind``); counts the decision."""
        tiers: dict[int, str] = {}
        for c in range(start // chunk_tokens, -(-end // chunk_tokens)):
            tiers[c] = long_kind if c in long_chunks else "ram"
        choice = choose_load(self.policy, start, end, chunk_tokens, tiers, self.costs, prompt_tokens)
        self.counters[R.CHECKS] += 1
        self.counters[R.UNPROMOTED] += choice.unpromoted
        if self._probe(choice, start, end):
            return LoadChoice(load_end=end, load_s=choice.load_s, recompute_s=choice.recompute_s)
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
                    "infera-kvd: recomputing a %d-token %s hit: loading it would take about %.1f ms "
                    "and save %.1f ms of forward time%s (counted as load_skipped_slower_tokens_%s; "
                    "INFERA_KVD_LOAD_POLICY=always loads every hit)",
                    n,
                    tier,
                    1000 * choice.load_s,
                    1000 * choice.recompute_s,
                    "; not worth a RAM load either, so not promoted" if choice.unpromoted else "",
                    tier,
                )
        return choice

    def _probe(self, choice: LoadChoice, start: int, end: int) -> bool:
        """Load a RAM hit judged slower anyway, while the RAM rate rests on fewer than
        :data:`PROBE_SAMPLES` loads and the estimate is within :data:`PROBE_MAX_RATIO` of recompute.
        A RAM hit that is recomputed is never timed, so one bad early sample would otherwise
        decide every later hit (H100 run M: a slow first load made auto recompute 8k-token RAM
        hits that load in 20 ms). Each probe is counted (``load_probe_requests``)."""
        if choice.reason != "slower" or set(choice.skipped) != {"ram"} or choice.load_end >= end:
            return False
        if self.costs.samples.get("ram", 0) >= PROBE_SAMPLES or self._probes >= PROBE_SAMPLES:
            return False
        if choice.load_s > PROBE_MAX_RATIO * choice.recompute_s:
            return False
        self._probes += 1
        self.counters["load_probe_requests"] += 1
        log.info(
            "infera-kvd: loading a %d-token RAM hit to time it (probe %d of at most %d: the RAM rate "
            "has %d samples; estimate %.1f ms against %.1f ms of forward time saved)",
            end - start,
            self._probes,
            PROBE_SAMPLES,
            self.costs.samples.get("ram", 0),
            1000 * choice.load_s,
            1000 * choice.recompute_s,
        )
        return True

    def forget_long_rates(self) -> None:
        """A new daemon process (the link reconnected): what its long tier read like before (a
        warm page cache, say) says nothing about it now. Back to the warm-up defaults, until its
        reads are timed again."""
        if self.costs.long_chunk_s:
            self.costs.long_chunk_s.clear()
            self.counters["timing_long_rates_reset"] += 1

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
