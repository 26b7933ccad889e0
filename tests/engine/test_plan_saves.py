"""Which chunks a step saves (infera/engine/vllm/scheduler/saves.py)."""

from __future__ import annotations

from collections import Counter

from infera.engine.vllm import groups as G
from infera.engine.vllm.scheduler.saves import plan_saves
from infera.engine.vllm.scheduler.state import ReqState

CT, BS = 32, 16


def state(chunks: int, found: int, allocated: int) -> ReqState:
    st = ReqState(hashes=[i.to_bytes(32, "big") for i in range(chunks)], retention="long", found=found)
    st.block_ids = [list(range(1, allocated + 1))]
    return st


def test_chunks_the_daemon_had_are_passed_over_without_their_blocks() -> None:
    """A warm 16k request: the daemon holds all 512 chunks. The plan goes straight past them,
    even before their blocks are listed, and saves only what comes after them."""
    plan, counters = G.single_group(BS, CT), Counter()
    st = state(chunks=512, found=512, allocated=0)
    assert plan_saves(st, plan, CT, 512 * CT, counters, None) == []
    assert st.next_save == 512
    st = state(chunks=6, found=4, allocated=12)
    jobs = plan_saves(st, plan, CT, 6 * CT, counters, None)
    assert [(j.chunk_hash[-1], j.block_ids) for j in jobs] == [(4, [9, 10]), (5, [11, 12])]
    assert st.next_save == 6 and not counters


def test_a_step_that_computed_part_of_the_found_chunks_moves_only_that_far() -> None:
    plan, counters = G.single_group(BS, CT), Counter()
    st = state(chunks=8, found=6, allocated=16)
    assert plan_saves(st, plan, CT, 3 * CT + 5, counters, None) == []
    assert st.next_save == 3
    jobs = plan_saves(st, plan, CT, 8 * CT, counters, None)
    assert [j.chunk_hash[-1] for j in jobs] == [6, 7] and st.next_save == 8


def test_unallocated_blocks_wait_for_a_later_step() -> None:
    plan, counters = G.single_group(BS, CT), Counter()
    st = state(chunks=4, found=1, allocated=5)  # chunk 2's second block is not there yet
    jobs = plan_saves(st, plan, CT, 4 * CT, counters, None)
    assert [j.chunk_hash[-1] for j in jobs] == [1] and st.next_save == 2
    st.block_ids[0] += [6, 7, 8]
    assert [j.chunk_hash[-1] for j in plan_saves(st, plan, CT, 4 * CT, counters, None)] == [2, 3]
