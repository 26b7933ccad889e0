"""Which prompt chunks a step saves: those whose every token is computed by the end of the step."""

from __future__ import annotations

from infera.engine.vllm.events import KvdEvents
from infera.engine.vllm.groups import Plan
from infera.engine.vllm.metadata import ChunkJob
from infera.engine.vllm.scheduler.state import ReqState


def plan_saves(
    st: ReqState,
    plan: Plan,
    chunk_tokens: int,
    computed_tokens: int,
    counters: dict[str, int],
    events: KvdEvents | None,
) -> list[ChunkJob]:
    """The save jobs of ``st``'s chunks complete at ``computed_tokens``, advancing ``st.next_save``.

    A chunk the daemon already had (``st.found``) is passed over, not saved again; one whose
    blocks are not all allocated yet waits for a later step; one with a block outside a sliding
    window (id 0: vLLM freed it after a local prefix-cache hit) cannot be saved and is counted.
    """
    if st.retention == "none":
        st.next_save = len(st.hashes)
        return []
    ct = chunk_tokens
    done = min(len(st.hashes), computed_tokens // ct)
    # chunks the daemon already had are not saved again: go straight past them
    st.next_save = max(st.next_save, min(st.found, done))
    jobs: list[ChunkJob] = []
    while st.next_save < done:
        c = st.next_save
        chunk: list[ChunkJob] = []
        for g, first, stop in plan.chunk_groups(c):
            bpc = g.blocks_per_chunk(ct)
            have = st.block_ids[g.index] if g.index < len(st.block_ids) else []
            ids = have[c * bpc + first : c * bpc + stop]
            if len(ids) < stop - first:
                return jobs  # not allocated yet: try again next step
            if 0 in ids:  # outside a window already (a local prefix-cache hit): cannot save
                chunk = []
                counters["save_skipped_outside_window"] += 1
                break
            chunk.append(ChunkJob(st.hashes[c], ids, group=g.index))
        if chunk:
            jobs += chunk
            if events is not None and st.request is not None:
                events.saved(st.request, c, st.hashes[c])
        st.next_save = c + 1
    return jobs
