"""Cost-aware loading: is loading a prefix from the daemon faster than recomputing it?

The scheduler half asks :func:`choose_load` once per request with what the lookup found (the
tier of every chunk of the hit) and a :class:`CostModel`; the answer is how many of those tokens
to load, how many it skipped and why (per tier), and which long-tier chunks to promote into RAM
in the background (PREWARM) because loading them now would be slower than recomputing them.

The model has two sides, both learned from measurements with warm-up defaults:

* **load time**: ``seconds = fixed + chunks * per_chunk`` for a load from RAM (arena to the
  engine's KV blocks, measured by the workers per load step, for this engine's chunk size; at
  least :data:`MIN_CHUNK_SHARE` of a sample counts per chunk, a sample faster than ``fixed``
  lowers ``fixed``, and no chunk is costed below :data:`MAX_LOAD_GBPS`), plus
  ``per_long_chunk[tier]`` for every chunk that the daemon first reads from its long tier (disk,
  distributed) during the same LEASE;
* **recompute time**: how long the engine's forward steps take by step size. The workers time
  every step without loads; steps of a few tokens (decode) give the fixed cost of a step, longer
  ones a point ``(tokens, seconds)`` per power-of-two bucket of step tokens. ``T(n)`` runs through
  those points (never decreasing, linear between them, and beyond the largest at the steeper of
  its last segment and the whole range). Loading the hit ``[start, end)`` of a ``P``-token prompt
  saves ``T(P - start) - T(P - end)``: the step still computes the rest of the prompt and still
  pays its fixed cost. On a launch-bound eager engine a 1,024-token step takes no longer than a
  decode step, so a 1k hit saves nothing there and is recomputed (H100 run N: a per-token model
  with a floor of a tenth of the average step loaded it, at 1.17x recompute, and priced a 2k hit
  at a third of what it saves, recomputing it at 1.8x a RAM load).

A prefix is loaded only when it is expected to save more than a margin: :data:`MIN_GAIN_S` plus
:data:`MIN_GAIN_SHARE` of its own expected load time. Both sides are estimates, and where they
are close the hit saves nothing worth its risk: on an eager 8B engine a 512-token prompt's forward
is bound by kernel launches, so its 511 tokens save ~3 ms of GPU time against ~1.5 ms of load,
and a step-to-step noise of several milliseconds decides which is faster (H100 run K).

A long-tier hit judged slower is promoted into RAM (PREWARM) only where the same hit would be
loaded from RAM: promoting a hit too short to be worth even a RAM load costs a round trip on the
scheduler's thread for nothing.

Everything here is pure: no vLLM, no daemon, no clock. Tests inject rates directly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infera.loadreport import POLICIES, TIERS

__all__ = ["POLICIES", "TIERS", "CostModel", "LoadChoice", "choose_load"]

# Warm-up defaults, until the workers have measured this engine. Loads from RAM: a registered
# arena on an H200 copies at about 53 GB/s; 20 GB/s leaves room for smaller GPUs and for the
# scatter into blocks. Long tiers: what the daemon read on the H200's disk after a restart
# (about 1.4 GB/s, docs/benchmarks.md); a distributed store over the network is slower still.
# Recompute: an 8B model on an H200 prefills about 33k tokens/s at 16k (490 ms).
DEFAULT_GBPS: dict[str, float] = {"ram": 20.0, "disk": 1.5, "distributed": 1.0}
DEFAULT_PREFILL_TPS = 30_000.0
DEFAULT_LOAD_FIXED_S = 0.5e-3  # one LEASE round trip and the copy's setup
DEFAULT_STEP_BASE_S = 5e-3  # a decode step
EWMA = 0.25  # weight of a new measurement
# A load's time splits into a fixed part and a part per chunk, which one sample cannot tell apart.
# So at least this share of every load's time is counted per chunk (a load faster than the assumed
# fixed cost also teaches a smaller fixed cost), and no chunk loads faster than MAX_LOAD_GBPS: a
# load is never costed at its fixed part alone, nor shown as an absurd rate.
MIN_CHUNK_SHARE = 0.5
MAX_LOAD_GBPS = 1000.0  # above the memory bandwidth of any one copy
SMALL_STEP_TOKENS = 16  # steps of at most this many tokens measure the fixed cost of a step
MIN_PREFILL_STEP = 64  # steps of at least this many tokens are points of T(n)
# a load must save at least this much more than recomputing (see the module's docstring)
MIN_GAIN_S = 1e-3
MIN_GAIN_SHARE = 0.1


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + EWMA * (new - old)


def margin(load_s: float) -> float:
    """How much more than ``load_s`` a load must save to be chosen (see the module's notes)."""
    return MIN_GAIN_S + MIN_GAIN_SHARE * load_s


def bucket(tokens: int) -> int:
    """The power-of-two bucket of a step of ``tokens`` tokens."""
    return max(0, int(math.log2(max(1, tokens))))


@dataclass
class CostModel:
    """Expected load and recompute times for one engine (its chunk size is fixed).

    ``chunk_bytes``: bytes of one chunk on one rank (every rank loads its share at once).
    ``gbps`` / ``prefill_tps``: the warm-up defaults (``INFERA_KVD_LOAD_RATES`` may set them).
    Measurements replace them as they come (:meth:`observe_load`, :meth:`observe_step`)."""

    chunk_bytes: int
    gbps: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_GBPS))
    prefill_tps: float = DEFAULT_PREFILL_TPS
    load_fixed_s: float = DEFAULT_LOAD_FIXED_S
    # learned (None: not measured yet, the default applies)
    ram_chunk_s: float | None = None
    long_chunk_s: dict[str, float] = field(default_factory=dict)
    step_base_s: float | None = None
    # bucket -> (tokens, seconds) of the steps without loads in it, both averaged (EWMA)
    step_s: dict[int, tuple[float, float]] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)  # how many measurements fed each rate

    # -- what the model expects --------------------------------------------------------------
    def default_chunk_s(self, tier: str) -> float:
        gbps = max(1e-6, float(self.gbps.get(tier, DEFAULT_GBPS.get(tier, 1.0))))
        return self.chunk_bytes / (gbps * 1e9)

    def ram_per_chunk(self) -> float:
        return self.ram_chunk_s if self.ram_chunk_s is not None else self.default_chunk_s("ram")

    def long_per_chunk(self, tier: str) -> float:
        """Extra seconds a chunk costs when the daemon reads it from ``tier`` first."""
        got = self.long_chunk_s.get(tier)
        return got if got is not None else self.default_chunk_s(tier)

    def load_seconds(self, chunks_by_tier: Mapping[str, int]) -> float:
        """Expected time of one load of that many chunks from each tier."""
        total = sum(chunks_by_tier.values())
        if total <= 0:
            return 0.0
        t = self.load_fixed_s + total * self.ram_per_chunk()
        for tier, n in chunks_by_tier.items():
            if tier != "ram" and n > 0:
                t += n * self.long_per_chunk(tier)
        return t

    def step_points(self) -> list[tuple[float, float]]:
        """The measured ``(tokens, seconds)`` of steps, fewest tokens first and never decreasing,
        from the fixed cost of a step (a decode step; before one is timed, the default or half the
        smallest step, whichever is less). Empty while nothing is measured."""
        pts = sorted(self.step_s.values())
        if self.step_base_s is not None:
            base = self.step_base_s
        elif pts:
            base = min(DEFAULT_STEP_BASE_S, pts[0][1] / 2)
        else:
            return []
        out = [(1.0, base)]
        for tokens, seconds in pts:
            if tokens > out[-1][0]:
                out.append((tokens, max(seconds, out[-1][1])))
        return out

    def step_seconds(self, tokens: int, pts: list[tuple[float, float]] | None = None) -> float:
        """Expected forward time of a step of ``tokens`` tokens (``T(n)`` of the module's notes);
        ``pts``: :meth:`step_points`, when the caller already has them."""
        if pts is None:
            pts = self.step_points()
        if len(pts) < 2:  # no step longer than a decode step measured yet: the warm-up rate
            base = pts[0][1] if pts else DEFAULT_STEP_BASE_S
            return base + max(0, tokens) / max(1e-6, self.prefill_tps)
        if tokens <= pts[0][0]:
            return pts[0][1]
        for (t0, s0), (t1, s1) in itertools.pairwise(pts):
            if tokens <= t1:
                return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
        (tf, sf), (tp, sp), (tl, sl) = pts[0], pts[-2], pts[-1]
        slope = max((sl - sp) / (tl - tp), (sl - sf) / (tl - tf))
        return sl + slope * (tokens - tl)

    def saved_seconds(self, computed: int, instead: int) -> float:
        """Forward time saved when a step computes ``instead`` tokens rather than ``computed``."""
        pts = self.step_points()
        return max(0.0, self.step_seconds(computed, pts) - self.step_seconds(instead, pts))

    # -- measurements ------------------------------------------------------------------------
    def min_chunk_s(self) -> float:
        """The least time a chunk's load is costed at (:data:`MAX_LOAD_GBPS`)."""
        return max(1, self.chunk_bytes) / (MAX_LOAD_GBPS * 1e9)

    def observe_load(self, chunks: int, long_chunks: Mapping[str, int], seconds: float) -> None:
        """One load step of ``chunks`` chunks (``long_chunks`` of them first read from a long tier)
        that took ``seconds`` until the KV was in the engine's blocks."""
        if chunks <= 0 or not seconds >= 0 or math.isinf(seconds):
            return
        if seconds < self.load_fixed_s:  # faster than the fixed cost assumed: it is smaller
            self.load_fixed_s = _ewma(self.load_fixed_s, seconds * (1 - MIN_CHUNK_SHARE))
        n_long = sum(n for n in long_chunks.values() if n > 0)
        if n_long == 0:
            per = max(seconds - self.load_fixed_s, seconds * MIN_CHUNK_SHARE) / chunks
            self.ram_chunk_s = _ewma(self.ram_chunk_s, max(per, self.min_chunk_s()))
            self._count("ram")
            return
        extra = max(0.0, seconds - self.load_fixed_s - chunks * self.ram_per_chunk()) / n_long
        extra = max(extra, self.min_chunk_s())
        for tier, n in long_chunks.items():
            if n > 0 and tier != "ram":
                self.long_chunk_s[tier] = _ewma(self.long_chunk_s.get(tier), extra)
                self._count(tier)

    def observe_tier_rate(self, tier: str, gbps: float, keys_per_chunk: float = 1.0) -> None:
        """The daemon's own measurement of ``tier``'s read rate into RAM (PREWARM answers with
        it). A tier judged slower than recompute is never loaded from, so the workers never time
        it again: this keeps its estimate current (a disk that got faster, a page cache that
        warmed) without a request paying for the measurement."""
        if tier == "ram" or gbps <= 0 or self.chunk_bytes <= 0:
            return
        per = max(self.chunk_bytes / (gbps * 1e9), self.min_chunk_s())
        self.long_chunk_s[tier] = _ewma(self.long_chunk_s.get(tier), per)
        self._count(tier + "_daemon")

    def observe_step(self, tokens: int, seconds: float) -> None:
        """One forward step of ``tokens`` tokens, without loads, that took ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        if tokens <= SMALL_STEP_TOKENS:
            self.step_base_s = _ewma(self.step_base_s, seconds)
            self._count("step_base")
            return
        if tokens < MIN_PREFILL_STEP:
            return
        b = bucket(tokens)
        old = self.step_s.get(b)
        self.step_s[b] = (
            (float(tokens), seconds) if old is None else (_ewma(old[0], tokens), _ewma(old[1], seconds))
        )
        self._count("prefill")

    def _count(self, what: str) -> None:
        self.samples[what] = self.samples.get(what, 0) + 1

    def summary(self) -> dict[str, float]:
        """The rates in use, in the units people read (GB/s, tokens/s), for logs and ``kvd stat``."""
        out: dict[str, float] = {}
        for tier in TIERS:
            per = self.ram_per_chunk() if tier == "ram" else self.long_per_chunk(tier)
            out[f"load_rate_{tier}_mbps"] = round(self.chunk_bytes / max(per, 1e-12) / 1e6, 1)
        n = 1 << 13  # the marginal rate of an 8k step: what it costs beyond a decode step
        out["prefill_rate_tps"] = round(n / max(self.saved_seconds(n + 1, 1), 1e-12), 1)
        return out


@dataclass
class LoadChoice:
    """What to do with one request's hit of ``[start, end)`` tokens.

    ``load_end``: load ``[start, load_end)`` (``start`` when nothing is loaded).
    ``skipped``: tokens of ``[load_end, end)`` not loaded, by the tier that held them.
    ``reason``: ``slower`` (judged slower than recompute, or not faster by the margin) or
    ``policy`` (``never``), or "".
    ``prewarm``: chunk indices held only by a long tier among the skipped ones (promote them).
    ``load_s`` / ``recompute_s``: the model's estimates for the whole hit: its load time, and the
    forward time loading it saves (for logs and tests).
    ``unpromoted``: long-tier chunks judged slower but not promoted, because the hit would not be
    worth loading from RAM either.
    """

    load_end: int
    skipped: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    prewarm: list[int] = field(default_factory=list)
    load_s: float = 0.0
    recompute_s: float = 0.0
    unpromoted: int = 0


def choose_load(
    policy: str,
    start: int,
    end: int,
    chunk_tokens: int,
    chunk_tier: Sequence[str] | Mapping[int, str],
    model: CostModel,
    prompt_tokens: int = 0,
) -> LoadChoice:
    """How much of the hit ``[start, end)`` of a ``prompt_tokens``-token prompt to load (0: the
    prompt ends right after the hit).

    ``chunk_tier[c]`` names the tier holding chunk ``c`` (chunks are ``chunk_tokens`` long; the hit
    may start and end inside a chunk). ``always`` loads it all, ``never`` nothing; ``auto`` loads
    the prefix ``[start, L)`` (L a chunk end, or ``end``) that saves the most time beyond its
    margin (``MIN_GAIN_S + MIN_GAIN_SHARE x`` its load time), and nothing when no prefix clears
    it: loads are linear in chunks, so the best prefix is usually all or nothing, but a hit whose
    tail lives on a slow tier loads its RAM head only."""
    if end <= start:
        return LoadChoice(load_end=start)
    ct = chunk_tokens
    first, last = start // ct, -(-end // ct)

    def tier(c: int) -> str:
        t = chunk_tier[c]
        return t if t in TIERS else "ram"

    # What the whole hit saves, spread evenly over its tokens: every prefix of one hit is priced
    # at the rate of the whole hit. Pricing a prefix at its own step size's rate let a noisy
    # bucket cut a RAM hit in two (H200 run H: a 4k hit recomputed 2,064 tokens and took 1.7x the
    # full load), which also moves the split point of the prompt for no gain.
    prompt = max(prompt_tokens, end + 1)
    recompute_s = model.saved_seconds(prompt - start, prompt - end)
    per_token = recompute_s / (end - start)
    # load_seconds of the growing prefix, added up chunk by chunk (a 16k hit has 512 chunks)
    per_chunk = {t: model.load_seconds({t: 1}) - model.load_fixed_s for t in TIERS}
    load_s = model.load_fixed_s
    best_end, best_gain = start, 0.0
    full_load = 0.0
    for c in range(first, last):
        load_s += per_chunk[tier(c)]
        stop = min(end, (c + 1) * ct)
        gain = (stop - start) * per_token - load_s - margin(load_s)
        full_load = load_s
        if gain > best_gain:
            best_end, best_gain = stop, gain
    if policy == "always":
        best_end, reason = end, ""
    elif policy == "never":
        best_end, reason = start, "policy"
    else:
        reason = "slower" if best_end < end else ""
    out = LoadChoice(load_end=best_end, reason=reason, load_s=full_load, recompute_s=recompute_s)
    for c in range(first, last):
        lo, hi = max(start, c * ct, best_end), min(end, (c + 1) * ct)
        if hi <= lo:
            continue
        t = tier(c)
        out.skipped[t] = out.skipped.get(t, 0) + hi - lo
        if t != "ram" and reason == "slower":
            out.prewarm.append(c)
    if out.prewarm:  # promote only what would then be loaded: the whole hit, from RAM
        ram_load = model.load_fixed_s + (last - first) * per_chunk["ram"]
        if recompute_s - ram_load - margin(ram_load) <= 0:
            out.unpromoted, out.prewarm = len(out.prewarm), []
    return out
