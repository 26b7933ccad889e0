"""The scheduler half: chunk keys, one LOOKUP per request, and each step's load and save plan.

Runs in the EngineCore process beside vLLM's scheduler. It holds a small state per request
(prompt chunk hashes, how many chunks the daemon already has, the request's block ids as the
scheduler hands them out) and turns each scheduler step into an :class:`InferaKvdMetadata`:

* **loads**: chunks the daemon has beyond the engine's own prefix-cache hit, decided in
  ``get_num_new_matched_tokens`` and placed in ``update_state_after_alloc``; loaded
  synchronously by the workers before the step's forward pass;
* **saves**: prompt chunks whose every token is computed by the end of this step (chunked
  prefill spreads a prompt over several steps), that the daemon did not already hold.

Nothing here raises into vLLM: a daemon that cannot be reached means no hits and no lookups.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from infera.engine.vllm.config import retention_of
from infera.engine.vllm.events import KvdEvents
from infera.engine.vllm.keys import Namespace, chunk_hashes, lookup_keys
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.stats import LONG_TIER_KIND, TIERS
from infera.kvd.client import KvdClientError

log = logging.getLogger("infera.engine.vllm")

HOLD_MS = 30_000
REPORT_EVERY_S = 5.0
MAX_TRACKED = 100_000


@dataclass
class _Req:
    hashes: list[bytes]
    retention: str
    found: int = 0
    local_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    next_save: int = 0
    long_chunks: set[int] = field(default_factory=set)  # found chunks only the long tier holds
    hits: dict[str, int] = field(default_factory=dict)  # tier -> tokens this request loads
    request: Any = None  # kept only while KV events are on (they need its block hashes)


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
        events: KvdEvents | None = None,
    ) -> None:
        self.ns = namespace
        self.events = events
        self.long_kind = "disk"  # the tier a long-tier hit counts under (from the daemon's HELLO)
        self.chunk_tokens = namespace.chunk_tokens
        self.block_size = block_size
        self.hash_block_size = hash_block_size
        self.blocks_per_chunk = self.chunk_tokens // block_size
        self.ranks = max(1, ranks)
        self.link = link
        self.disabled_reason = disabled_reason
        self.reqs: dict[str, _Req] = {}
        self.pending_loads: list[RequestJob] = []
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "lookups",
                "lookup_errors",
                "query_tokens",
                "hit_tokens",
                "load_chunks",
                "save_chunks",
                "retention_none_requests",
                *(f"hit_tokens_{t}" for t in TIERS),
            ),
            0,
        )
        self._last_report = 0.0

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    # -- vLLM hooks --------------------------------------------------------------------------
    def matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """How many tokens beyond ``num_computed_tokens`` the daemon can supply (sync load)."""
        if not self.enabled:
            return 0, False
        st = self._track(request)
        st.local_tokens = num_computed_tokens
        # vLLM must compute at least the prompt's last token, so the most we can load ends at the
        # last whole block before it. That may cut the last stored chunk: its leading blocks are
        # loaded (the payload is [layer][block][page], so a block prefix is a plain slice).
        limit = max(0, int(request.num_tokens) - 1) // self.block_size * self.block_size
        limit = min(limit, len(st.hashes) * self.chunk_tokens)
        # Hold found chunks against eviction only when some of them may be loaded.
        st.found, st.long_chunks = self._lookup(st.hashes, HOLD_MS if limit > num_computed_tokens else 0)
        if self.events is not None:
            self.events.looked_up(request, st.hashes, st.found, st.long_chunks)
        self.counters["query_tokens"] += max(0, int(request.num_tokens) - num_computed_tokens)
        hit = min(st.found * self.chunk_tokens, limit) - num_computed_tokens
        if hit <= 0:
            return 0, False
        self.counters["hit_tokens"] += hit
        return hit, False

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Plan the load of the ``num_external_tokens`` that ``matched_tokens`` promised."""
        st = self.reqs.get(request.request_id)
        if st is None or num_external_tokens <= 0:
            return
        block_ids = list(blocks.get_block_ids()[0])
        start, end = st.local_tokens, st.local_tokens + num_external_tokens
        bs, cb, ct = self.block_size, self.blocks_per_chunk, self.chunk_tokens
        jobs: list[ChunkJob] = []
        for c in range(start // ct, -(-end // ct)):
            ids = block_ids[c * cb : (c + 1) * cb]
            if len(ids) < cb or c >= len(st.hashes):
                break
            skip = max(0, start // bs - c * cb)
            stop = min(cb, -(-end // bs) - c * cb)
            if skip < stop:
                jobs.append(ChunkJob(st.hashes[c], ids, skip, None if stop == cb else stop))
        if jobs:
            self.counters["load_chunks"] += len(jobs)
            self.pending_loads.append(RequestJob(request.request_id, jobs))
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

    def _split(self, st: _Req, start: int, end: int) -> dict[str, int]:
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
        meta = InferaKvdMetadata(loads=self.pending_loads)
        self.pending_loads = []
        if self.enabled:
            try:
                self._plan_step(scheduler_output, meta)
            except Exception:
                log.exception("infera-kvd: could not plan this step's saves; skipping them")
                meta.saves = []
        self._maybe_report()
        return meta

    def poison_load(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Make the promised tokens a load error (so vLLM recomputes them) when planning failed."""
        st = self.reqs.get(request.request_id)
        start = st.local_tokens if st is not None else 0
        ids = list(blocks.get_block_ids()[0])
        first = start // self.block_size
        last = -(-(start + num_external_tokens) // self.block_size)
        if ids[first:last]:
            self.pending_loads.append(RequestJob(request.request_id, [ChunkJob(b"", ids[first:last])]))

    def _plan_step(self, scheduler_output: Any, meta: InferaKvdMetadata) -> None:
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self.reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0]) if new.block_ids else []
            self._plan_saves(new.req_id, st, new.num_computed_tokens + scheduled.get(new.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self.reqs.get(req_id)
            if st is None or st.next_save >= len(st.hashes):
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            self._plan_saves(req_id, st, cached.num_computed_tokens[i] + scheduled.get(req_id, 0), meta)

    def finished(self, request: Any) -> None:
        self.reqs.pop(request.request_id, None)

    # -- internals ---------------------------------------------------------------------------
    def _track(self, request: Any) -> _Req:
        prompt = int(getattr(request, "num_prompt_tokens", 0) or len(request.prompt_token_ids or ()))
        hashes = chunk_hashes(list(request.block_hashes), self.chunk_tokens, self.hash_block_size, prompt)
        retention = retention_of(getattr(request, "kv_transfer_params", None))
        if retention == "none":
            self.counters["retention_none_requests"] += 1
        st = _Req(hashes=hashes, retention=retention)
        if self.events is not None:
            st.request = request
        if len(self.reqs) >= MAX_TRACKED:
            self.reqs.pop(next(iter(self.reqs)))
        self.reqs[request.request_id] = st
        return st

    def _lookup(self, hashes: list[bytes], hold_ms: int) -> tuple[int, set[int]]:
        """How many leading chunks every rank can load, and which of them only the long tier has."""
        if not hashes or self.link is None:
            return 0, set()
        keys = lookup_keys(self.ns.digest, hashes, self.ranks)
        self.counters["lookups"] += 1
        try:
            (count, on_long), long_tier = self.link.call(
                lambda c: (c.lookup_tiers(keys, hold_ms=hold_ms), c.long_tier)
            )
        except KvdClientError:
            self.counters["lookup_errors"] += 1
            return 0, set()
        self.long_kind = LONG_TIER_KIND.get(str(long_tier), "disk")
        return count // self.ranks, {i // self.ranks for i in on_long}

    def _plan_saves(self, req_id: str, st: _Req, computed_tokens: int, meta: InferaKvdMetadata) -> None:
        if st.retention == "none":
            st.next_save = len(st.hashes)
            return
        cb = self.blocks_per_chunk
        done = min(len(st.hashes), computed_tokens // self.chunk_tokens)
        jobs: list[ChunkJob] = []
        while st.next_save < done:
            c = st.next_save
            ids = st.block_ids[c * cb : (c + 1) * cb]
            if len(ids) < cb:
                break
            if c >= st.found:
                jobs.append(ChunkJob(st.hashes[c], ids))
                if self.events is not None and st.request is not None:
                    self.events.saved(st.request, c, st.hashes[c])
            st.next_save = c + 1
        if jobs:
            self.counters["save_chunks"] += len(jobs)
            meta.saves.append(RequestJob(req_id, jobs, st.retention))

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if self.link is None or now - self._last_report < REPORT_EVERY_S:
            return
        self._last_report = now
        self.link.report(data_path="control", counters={**self.counters, **self.link.counters})
