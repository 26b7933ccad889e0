"""The scheduler half: chunk keys, one LOOKUP per request, and each step's load and save plan.

Runs in the EngineCore process beside vLLM's scheduler. It holds a small state per request
(prompt chunk hashes, how many chunks the daemon already has, the request's block ids as the
scheduler hands them out) and turns each scheduler step into an :class:`InferaKvdMetadata`:

* **loads**: chunks the daemon has beyond the engine's own prefix-cache hit, decided in
  ``get_num_new_matched_tokens`` and placed in ``update_state_after_alloc``; loaded
  synchronously by the workers before the step's forward pass;
* **saves**: prompt chunks whose every token is computed by the end of this step (chunked
  prefill spreads a prompt over several steps), that the daemon did not already hold.

Hybrid models (several KV cache groups, :mod:`infera.engine.vllm.groups`): one key per chunk per
group per rank, each group storing and loading only the blocks vLLM's hybrid manager reads. vLLM
cannot map a failed block back to a request when there are several groups (0.32 raises, 0.26
fails to unpack), so their loads fail per request instead: asynchronous loads reported through
``failed_recving`` where vLLM has it (0.30+); before that, loads stay synchronous and the lookup
first makes sure every chunk is in RAM and held, so only a daemon that dies inside one engine step
can still fail a load (the worker then logs an error: :data:`FAIL_NONE`).

Nothing here raises into vLLM: a daemon that cannot be reached means no hits and no lookups.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from infera.engine.vllm import groups
from infera.engine.vllm.config import DEFAULT_REPORT_EVERY_S
from infera.engine.vllm.events import KvdEvents
from infera.engine.vllm.groups import Plan
from infera.engine.vllm.keys import Namespace, chunk_hashes
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.retention import retention_of
from infera.engine.vllm.scheduler.loadcost import CostModel
from infera.engine.vllm.scheduler.lookup import count_found
from infera.engine.vllm.scheduler.policy import LoadPolicy
from infera.engine.vllm.scheduler.saves import plan_saves
from infera.engine.vllm.scheduler.state import ReqState
from infera.engine.vllm.stats import LONG_TIER_KIND, TIERS
from infera.kvd.client import KvdClientError

log = logging.getLogger("infera.engine.vllm")

HOLD_MS = 30_000
MAX_TRACKED = 100_000
MAX_FAILED = 10_000

# How a load failure reaches vLLM: block ids (one group), the request (async loads, vLLM 0.30+),
# or not at all (several groups before vLLM 0.30: the lookup makes failure all but impossible).
FAIL_BLOCKS = "blocks"
FAIL_REQUESTS = "requests"
FAIL_NONE = "none"


class SchedulerHalf:
    """Scheduler-side logic of :class:`InferaKvdConnector`, with vLLM objects duck-typed."""

    def __init__(
        self,
        namespace: Namespace,
        *,
        block_size: int,
        hash_block_size: int,
        ranks: int,
        link: DaemonLink | None,
        disabled_reason: str | None = None,
        plan: Plan | None = None,
        failure: str = FAIL_BLOCKS,
        events: KvdEvents | None = None,
        policy: str = "always",
        costs: CostModel | None = None,
        report_every_s: float = DEFAULT_REPORT_EVERY_S,
        loads: bool = True,
        saves: bool = True,
    ) -> None:
        self.ns = namespace
        self.chunk_tokens = namespace.chunk_tokens
        self.block_size = block_size
        self.hash_block_size = hash_block_size
        self.plan = plan or groups.single_group(block_size, self.chunk_tokens)
        # hits end on a block boundary of every group
        self.unit = groups.lcm_block_size(self.plan)
        self.blocks_per_chunk = self.chunk_tokens // block_size
        self.ranks = max(1, ranks)
        self.link = link
        self.disabled_reason = disabled_reason
        self.events = events
        self.long_kind = "disk"  # the tier a long-tier hit counts under (from the daemon's HELLO)
        self.failure = failure if self.plan.hybrid else FAIL_BLOCKS
        self.reqs: dict[str, ReqState] = {}
        self.failed: dict[str, None] = {}  # requests whose asynchronous load failed: no more hits
        self.pending_loads: list[RequestJob] = []
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "lookups",
                "lookup_errors",
                "query_tokens",
                "hit_tokens",
                "load_chunks",
                "save_chunks",
                "save_skipped_outside_window",
                "retention_none_requests",
                "hit_tokens_cut_to_chunk",
                "async_loads",
                "load_plan_failures",
                "verify_lost_chunks",
                "verify_unheld_chunks",
                "sched_us",  # time in the scheduler hooks (kvd_connector)
                *(f"hit_tokens_{t}" for t in TIERS),
            ),
            0,
        )
        self._last_report = 0.0
        self._connects = 0  # the link's connections at the last lookup (a new one: a new daemon)
        self.report_every_s = report_every_s  # INFERA_KVD_REPORT_EVERY_S
        # what the connector's kv_role lets it do: kv_producer loads no hits, kv_consumer saves nothing
        self.loads = loads
        self.saves = saves
        chunk_bytes = max(1, namespace.chunk_tokens * 1024)
        self.policy = LoadPolicy(policy, costs or CostModel(chunk_bytes=chunk_bytes), self.counters)

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    @property
    def load_async(self) -> bool:
        return self.failure == FAIL_REQUESTS

    # -- vLLM hooks --------------------------------------------------------------------------
    def matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """How many tokens beyond ``num_computed_tokens`` the daemon can supply (sync load, or
        async for hybrid models where vLLM takes a failure per request)."""
        if not self.enabled:
            return 0, False
        st = self._track(request)
        st.local_tokens = num_computed_tokens
        if request.request_id in self.failed:  # its last load failed: recompute, do not retry
            return 0, False
        # vLLM must compute at least the prompt's last token, so the most we can load ends at the
        # last whole block before it. That may cut the last stored chunk: its leading blocks are
        # loaded (the payload is [layer][block][page], so a block prefix is a plain slice).
        limit = max(0, int(request.num_tokens) - 1) // self.unit * self.unit
        limit = min(limit, len(st.hashes) * self.chunk_tokens)
        # Hold found chunks against eviction only when some of them may be loaded.
        may_load = self.loads and limit > num_computed_tokens
        st.found, st.long_chunks = self._lookup(st.hashes, HOLD_MS if may_load else 0)
        if self.events is not None:
            self.events.looked_up(request, st.hashes, st.found, st.long_chunks)
        self.counters["query_tokens"] += max(0, int(request.num_tokens) - num_computed_tokens)
        if not self.loads:  # kv_producer: the lookup only spares the saves what the daemon holds
            return 0, False
        end = min(st.found * self.chunk_tokens, limit)
        # a hybrid hit ends where every group's chunks hold what vLLM will read
        servable = self.plan.hit_end(num_computed_tokens, end)
        if servable < end:
            self.counters["hit_tokens_cut_to_chunk"] += end - servable
        if servable > num_computed_tokens:
            servable = self._worth_loading(st, num_computed_tokens, servable, int(request.num_tokens))
        hit = servable - num_computed_tokens
        if hit <= 0:
            return 0, False
        self.counters["hit_tokens"] += hit
        if self.load_async:
            self.counters["async_loads"] += 1
        return hit, self.load_async

    def _worth_loading(self, st: ReqState, start: int, end: int, prompt_tokens: int) -> int:
        """Where the load of the hit ``[start, end)`` ends, by the load policy: the rest is
        recomputed, and its long-tier chunks are promoted into RAM for the next request."""
        choice = self.policy.cut(start, end, self.chunk_tokens, st.long_chunks, self.long_kind, prompt_tokens)
        if choice.prewarm and self.link is not None:
            keys, per_chunk = groups.plan_keys(self.plan, self.ns.digest, st.hashes, self.ranks)
            self.policy.prewarm(self.link, keys, per_chunk, choice.prewarm, self.long_kind)
        if choice.load_end >= end:
            return end
        return self.plan.hit_end(start, choice.load_end) if choice.load_end > start else start

    def observe(self, worker_meta: Any) -> None:
        """The workers' timings of a step (vLLM 0.18+ worker metadata): the cost model learns."""
        self.policy.observe(worker_meta, self.long_kind)

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Plan the load of the ``num_external_tokens`` that ``matched_tokens`` promised."""
        st = self.reqs.get(request.request_id)
        if st is None or num_external_tokens <= 0:
            return
        block_ids = [list(ids) for ids in blocks.get_block_ids()]
        start, end = st.local_tokens, st.local_tokens + num_external_tokens
        ct = self.chunk_tokens
        jobs: list[ChunkJob] = []
        # what does not change from chunk to chunk (a 16k hit of an 8B model has 512 chunks)
        needed = [(g, g.blocks_per_chunk(ct), *g.needed_blocks(start, end)) for g in self.plan.offloaded]
        stored: dict[int, tuple[int, int]] = {}
        for c in range(start // ct, -(-end // ct)):
            if c >= len(st.hashes):
                raise ValueError(f"chunk {c} of a {len(st.hashes)}-chunk prompt")
            if c == start // ct or self.plan.varies_by_chunk:
                stored = {g.index: (first, stop) for g, first, stop in self.plan.chunk_groups(c)}
            for g, bpc, need_lo, need_hi in needed:
                lo, hi = max(need_lo, c * bpc), min(need_hi, (c + 1) * bpc)
                if lo >= hi:
                    continue  # nothing of this group in this chunk is read (outside its window)
                first, stop = stored.get(g.index, (bpc, bpc))
                base = c * bpc + first
                if lo < base or hi > c * bpc + stop:
                    raise ValueError(f"group {g.index} needs blocks {lo}..{hi} that chunk {c} does not store")
                ids = block_ids[g.index][base : c * bpc + stop]
                if len(ids) < stop - first or 0 in ids[lo - base : hi - base]:
                    raise ValueError(f"group {g.index} has no blocks for {lo}..{hi}")
                skip, last = lo - base, hi - base
                end_at = None if last == len(ids) else last
                jobs.append(ChunkJob(st.hashes[c], ids, skip, end_at, g.index, long=c in st.long_chunks))
        self.counters["load_chunks"] += len({j.chunk_hash for j in jobs})
        if jobs or self.load_async:
            self.pending_loads.append(RequestJob(request.request_id, jobs, notify=self.load_async))
        st.hits = self._split(st, start, end)
        for tier, n in st.hits.items():
            self.counters[f"hit_tokens_{tier}"] += n

    def hit_sources(self, request: Any, num_external_tokens: int) -> dict[str, int]:
        """``num_external_tokens`` of ``request`` by tier (``ram``, ``disk``, ``distributed``),
        as planned in :meth:`after_alloc`; the counts sum to ``num_external_tokens``."""
        if num_external_tokens <= 0:
            return {}
        st = self.reqs.get(request.request_id)
        hits = dict(st.hits) if st is not None and st.hits else {"ram": num_external_tokens}
        extra = num_external_tokens - sum(hits.values())
        if extra:  # vLLM counted more (or fewer) than planned: the difference goes to RAM
            hits["ram"] = hits.get("ram", 0) + extra
            for tier in [t for t, n in hits.items() if n < 0]:
                hits["ram"] += hits.pop(tier)
        return {t: n for t, n in hits.items() if n > 0}

    def _split(self, st: ReqState, start: int, end: int) -> dict[str, int]:
        ct = self.chunk_tokens
        out: dict[str, int] = {}
        for c in range(start // ct, -(-end // ct)):
            n = min(end, (c + 1) * ct) - max(start, c * ct)
            if n > 0:
                tier = self.long_kind if c in st.long_chunks else "ram"
                out[tier] = out.get(tier, 0) + n
        return out

    def build_meta(self, scheduler_output: Any) -> InferaKvdMetadata:
        """This step's jobs. Loads come first and always ship: vLLM already counts them as computed."""
        tokens = getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        meta = InferaKvdMetadata(loads=self.pending_loads, step_tokens=int(tokens or 0))
        self.pending_loads = []
        if self.enabled and self.saves:
            try:
                self._plan_step(scheduler_output, meta)
            except Exception:
                log.exception("infera-kvd: could not plan this step's saves; skipping them")
                meta.saves = []
        self._maybe_report()
        return meta

    def poison_load(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Make the promised tokens a load error (so vLLM recomputes them) when planning failed:
        the blocks of a single-group engine, the whole request of a hybrid one."""
        self.counters["load_plan_failures"] += 1
        if self.plan.hybrid:
            if self.failure == FAIL_NONE:
                log.error(
                    "infera-kvd: could not plan the load of request %s on a hybrid model, and this "
                    "vLLM cannot recompute it (it takes load failures per request from 0.30); its "
                    "output may be wrong",
                    request.request_id,
                )
            self.pending_loads.append(RequestJob(request.request_id, [], notify=self.load_async, fail=True))
            return
        st = self.reqs.get(request.request_id)
        start = st.local_tokens if st is not None else 0
        ids = list(blocks.get_block_ids()[0])
        first = start // self.block_size
        last = -(-(start + num_external_tokens) // self.block_size)
        if ids[first:last]:
            self.pending_loads.append(RequestJob(request.request_id, [ChunkJob(b"", ids[first:last])]))

    def load_failed(self, req_ids: Any) -> None:
        """vLLM reports these requests' asynchronous loads failed: they recompute, and their
        next lookup offers no hit (a chunk that failed once would fail again)."""
        for req_id in req_ids or ():
            self.failed[req_id] = None
            if len(self.failed) > MAX_FAILED:
                self.failed.pop(next(iter(self.failed)))

    def _plan_step(self, scheduler_output: Any, meta: InferaKvdMetadata) -> None:
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self.reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = [list(ids) for ids in new.block_ids] if new.block_ids else []
            self._plan_saves(new.req_id, st, new.num_computed_tokens + scheduled.get(new.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self.reqs.get(req_id)
            if st is None or st.next_save >= len(st.hashes):
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = [list(ids) for ids in new_ids] if new_ids else []
            elif new_ids:
                if not st.block_ids:
                    st.block_ids = [[] for _ in new_ids]
                for mine, more in zip(st.block_ids, new_ids, strict=False):
                    mine.extend(more)
            self._plan_saves(req_id, st, cached.num_computed_tokens[i] + scheduled.get(req_id, 0), meta)

    def finished(self, request: Any) -> None:
        self.reqs.pop(request.request_id, None)

    # -- internals ---------------------------------------------------------------------------
    def _track(self, request: Any) -> ReqState:
        prompt = int(getattr(request, "num_prompt_tokens", 0) or len(request.prompt_token_ids or ()))
        hashes = chunk_hashes(list(request.block_hashes), self.chunk_tokens, self.hash_block_size, prompt)
        retention = retention_of(getattr(request, "kv_transfer_params", None))
        if retention == "none":
            self.counters["retention_none_requests"] += 1
        st = ReqState(hashes=hashes, retention=retention)
        if self.events is not None:
            st.request = request
        if len(self.reqs) >= MAX_TRACKED:
            self.reqs.pop(next(iter(self.reqs)))
        self.reqs[request.request_id] = st
        return st

    def _lookup(self, hashes: list[bytes], hold_ms: int) -> tuple[int, set[int]]:
        """How many leading chunks the daemon holds for every group and rank, and which of them
        only the long tier has."""
        if not hashes or self.link is None:
            return 0, set()
        keys, per_chunk = groups.plan_keys(self.plan, self.ns.digest, hashes, self.ranks)
        verify = self.failure == FAIL_NONE and hold_ms > 0
        self.counters["lookups"] += 1
        try:
            found, long_chunks, long_tier = self.link.call(
                lambda c: count_found(c, keys, per_chunk, hold_ms, verify, self.counters)
            )
        except KvdClientError:
            self.counters["lookup_errors"] += 1
            return 0, set()
        self.long_kind = LONG_TIER_KIND.get(long_tier, "disk")
        connects = self.link.counters.get("connects", 0)
        if connects != self._connects:
            if self._connects:  # not the first connection: a daemon restart
                self.policy.forget_long_rates()
            self._connects = connects
        return found, long_chunks

    def _plan_saves(self, req_id: str, st: ReqState, computed_tokens: int, meta: InferaKvdMetadata) -> None:
        jobs = plan_saves(st, self.plan, self.chunk_tokens, computed_tokens, self.counters, self.events)
        if jobs:
            self.counters["save_chunks"] += len({j.chunk_hash for j in jobs})
            meta.saves.append(RequestJob(req_id, jobs, st.retention))

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if self.link is None or now - self._last_report < self.report_every_s:
            return
        self._last_report = now
        counters = {**self.counters, **self.link.counters, **self.policy.report()}
        self.link.report(data_path="control", counters=counters)
