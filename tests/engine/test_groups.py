"""KV cache groups (infera/engine/vllm/groups.py): what each chunk stores, which hits are served,
and that a load plan fills exactly the blocks vLLM's hybrid manager allocates for a hit."""

from __future__ import annotations

import itertools
import random

import pytest

from infera.engine.vllm import groups as G
from infera.engine.vllm.keys import chunk_key
from infera.kvlayout import check, describe_group, notes, render


def sliding(i: int, window: int, bs: int = 16, extra: int = 0) -> G.GroupPlan:
    return G.GroupPlan(i, G.SLIDING, bs, window=window, extra_tokens=extra, num_layers=1)


def full(i: int, bs: int = 16) -> G.GroupPlan:
    return G.GroupPlan(i, G.FULL, bs, num_layers=1)


def chunked(i: int, size: int, bs: int = 16) -> G.GroupPlan:
    return G.GroupPlan(i, G.CHUNKED, bs, attention_chunk=size, num_layers=1)


def test_vllm_skipped_tokens() -> None:
    # vLLM's examples: window 4 skips 4 of 7 computed; local chunk 8 skips 8 of 13, 8 of 8, 0 of 7
    assert sliding(0, 4, bs=1).skipped(7) == 4
    assert sliding(0, 4, bs=1).skipped(2) == 0
    assert [chunked(0, 8, bs=1).skipped(n) for n in (13, 8, 7)] == [8, 8, 0]
    assert full(0).skipped(10_000) == 0


def test_sliding_window_stores_the_chunk_tail_a_hit_reads() -> None:
    g = sliding(1, window=200, bs=16)  # reads cdiv(199, 16) = 13 blocks at a hit end
    assert g.stored_blocks(512) == 13 and g.stored_range(3, 512) == (32 - 13, 32)
    assert sliding(1, window=4096).stored_blocks(512) == 32  # window longer than a chunk: all of it
    assert sliding(1, window=200, extra=16).stored_blocks(512) == 14  # retained MTP tokens too
    assert full(0).stored_range(5, 512) == (0, 32)


def test_chunked_local_stores_nothing_for_chunks_ending_on_its_boundary() -> None:
    g = chunked(0, 1024)
    assert [g.stored_range(c, 256) for c in range(5)] == [(0, 16), (0, 16), (0, 16), None, (0, 16)]


def test_hits_inside_a_chunk_only_where_every_group_stores_them() -> None:
    plan = G.Plan((sliding(0, 200), full(1)), 512)
    assert plan.servable(0, 1024) and plan.servable(0, 512)
    assert not plan.servable(0, 896)
    assert plan.hit_end(0, 896) == 512  # cut back to the chunk boundary
    long_window = G.Plan((sliding(0, 4096), full(1)), 512)
    assert long_window.hit_end(0, 896) == 896
    assert G.single_group(16, 512).hit_end(0, 896) == 896


def _vllm_blocks(g: G.GroupPlan, local: int, end: int) -> list[int]:
    """Block indices vLLM gives real blocks for, beyond the local hit, after a hit of ``end``
    tokens (``add_local_computed_blocks`` + ``allocate_external_computed_blocks``)."""
    skipped = g.skipped(end) // g.block_size
    return [b for b in range(skipped, -(-end // g.block_size)) if b >= local // g.block_size]


@pytest.mark.parametrize("seed", range(4))
def test_load_plans_fill_exactly_what_vllm_allocates(seed: int) -> None:
    """For random windows, chunk sizes and hits: every block vLLM allocates for the external part
    of a served hit lies in what the chunks store, and the plan asks for no other block."""
    rng = random.Random(seed)
    for _ in range(300):
        bs = rng.choice((16, 32, 128))
        ct = bs * rng.randint(1, 8)
        groups = (
            full(0, bs),
            sliding(1, rng.randint(2, 6 * ct), bs, extra=rng.choice((0, 0, 5))),
            chunked(2, bs * rng.randint(1, 12), bs),
        )
        plan = G.Plan(groups, ct)
        chunks = rng.randint(1, 8)
        local = rng.randint(0, chunks * ct // bs) * bs
        end = plan.hit_end(local, rng.randint(local // bs, chunks * ct // bs) * bs)
        if end <= local:
            continue
        for g in groups:
            first, stop = g.needed_blocks(local, end)
            assert list(range(first, stop)) == _vllm_blocks(g, local, end)
            bpc = g.blocks_per_chunk(ct)
            for b in range(first, stop):
                rng_ = g.stored_range(b // bpc, ct)
                assert rng_ is not None and rng_[0] <= b % bpc < rng_[1], (g, local, end, b)


def test_chunk_boundaries_are_always_served() -> None:
    for window, ct, bs in itertools.product((2, 100, 129, 700, 5000), (128, 256, 512), (16, 128)):
        if ct % bs:
            continue
        plan = G.Plan((full(0, bs), sliding(1, window, bs), chunked(2, 384, bs)), ct)
        for c in range(1, 10):
            assert plan.servable(0, c * ct) and plan.servable(ct, c * ct + ct)


def test_keys_of_a_single_group_engine_are_unchanged() -> None:
    ns, hashes = b"n" * 16, [bytes([i]) * 32 for i in range(3)]
    plan = G.single_group(16, 256)
    keys, per_chunk = G.plan_keys(plan, ns, hashes, 2)
    assert keys == [chunk_key(ns, h, r) for h in hashes for r in range(2)]
    assert per_chunk == [2, 2, 2]
    assert G.whole_chunks(5, per_chunk) == 2


def test_hybrid_keys_carry_the_group_and_skip_groups_a_chunk_does_not_store() -> None:
    ns, hashes = b"n" * 16, [bytes([i]) * 32 for i in range(4)]
    plan = G.Plan((full(0), chunked(1, 512)), 256)  # chunk 1 ends on 512: nothing of group 1
    keys, per_chunk = G.plan_keys(plan, ns, hashes, 1)
    assert per_chunk == [2, 1, 2, 1]
    assert keys[0] == chunk_key(ns, hashes[0], 0, plan.tag(0)) != chunk_key(ns, hashes[0], 0)
    assert len(set(keys)) == len(keys)
    assert plan.tag(0) != plan.tag(1)
    assert G.whole_chunks(3, per_chunk) == 2 and G.whole_chunks(6, per_chunk) == 4


def test_state_groups_block_and_say_why() -> None:
    state = G.GroupPlan(1, G.STATE, 16, num_layers=24, offload=False, reason="recurrent state")
    rebuilt = G.GroupPlan(2, G.FULL, 16, offload=False, reason="replica", transfer=False)
    plan = G.Plan((full(0), state, rebuilt), 256)
    assert G.blockers(plan) == [state]
    assert plan.group_ids == (0,)
    assert "not offloaded (recurrent state)" in plan.summary()


def test_wire_round_trip_and_kvlayout_bounds() -> None:
    plan = G.Plan((sliding(0, 200, bs=128), full(1, bs=128)), 512)
    wire = plan.to_wire()
    assert G.Plan.from_wire(wire, 512).groups == plan.groups
    layout = check({"tp": 2, "groups": wire})
    assert describe_group(layout["groups"][0]).endswith("the last 2 of 4 blocks of each chunk (the window)")
    for bad in ({"groups": [{"x": [1]}]}, {"k" * 40: 1}, {"groups": [{}] * 65}, {"a": "x" * 201}, [1]):
        with pytest.raises(ValueError):
            check(bad)


def test_kvd_stat_says_why_engines_of_one_model_do_not_share() -> None:
    groups = G.Plan((sliding(0, 200), full(1)), 256).to_wire()

    def client(ns: str, tp: int, role: str = "vllm-scheduler") -> dict[str, object]:
        return {
            "namespace": ns,
            "model": "m",
            "role": role,
            "kv_layout": {"tp": tp, "pp": 1, "groups": groups},
        }

    lines = render([client("a", 1), client("a", 1, "vllm-worker-0"), client("b", 2)])
    assert any(line.startswith("namespace a: model m, tp 1, pp 1") for line in lines)
    assert any("group 0: sliding window 200" in line for line in lines)
    (note,) = notes([client("a", 1), client("b", 2)])
    assert "2 namespaces" in note and "tensor parallel size 1 vs 2" in note
    off = {
        "namespace": "a",
        "model": "m",
        "role": "vllm-scheduler",
        "kv_layout": {"groups": [{"group": 0, "kind": "full"}]},
    }
    assert any("different KV cache groups" in n for n in notes([client("a", 1), off]))


def test_prewarm_reads_a_hybrid_engines_groups_from_what_it_declared() -> None:
    from infera.engine.vllm.api.prewarm import declared_plan

    plan = G.Plan((sliding(0, 200), full(1)), 256)
    stats = {
        "clients": [
            {"namespace": "other", "role": "vllm-scheduler", "kv_layout": {"groups": plan.to_wire()}},
            {"namespace": "ns", "role": "vllm-worker-0", "kv_layout": {"groups": plan.to_wire()}},
            {"namespace": "ns", "role": "vllm-scheduler", "kv_layout": {"groups": plan.to_wire()}},
        ]
    }
    got = declared_plan(stats, "ns", 256)
    assert got is not None and got.groups == plan.groups
    assert [got.tag(i) for i in (0, 1)] == [plan.tag(i) for i in (0, 1)]
    assert declared_plan(stats, "missing", 256) is None
    single = {
        "clients": [
            {"namespace": "ns", "role": "vllm-scheduler", "kv_layout": {"groups": plan.to_wire()[:1]}}
        ]
    }
    assert declared_plan(single, "ns", 256) is None  # one group: the keys need no tag


def test_long_tier_key_indices_map_to_their_chunks() -> None:
    per_chunk = [2, 3, 3]  # keys 0-1 chunk 0, 2-4 chunk 1, 5-7 chunk 2
    assert G.chunks_of([0, 1, 4], per_chunk, 3) == {0, 1}
    assert G.chunks_of([5, 7], per_chunk, 3) == {2}
    assert G.chunks_of([5, 7], per_chunk, 2) == set()  # beyond the found chunks: not a hit
    assert G.chunks_of([], per_chunk, 3) == set()


def _servable_by_blocks(plan: G.Plan, local: int, end: int) -> bool:
    """Plan.servable's rule, block by block, with no shortcut."""
    for g in plan.offloaded:
        first, stop = g.needed_blocks(local, end)
        bpc = g.blocks_per_chunk(plan.chunk_tokens)
        for b in range(first, stop):
            rng_ = g.stored_range(b // bpc, plan.chunk_tokens)
            if rng_ is None or not rng_[0] <= b % bpc < rng_[1]:
                return False
    return True


@pytest.mark.parametrize("seed", range(3))
def test_what_a_plan_works_out_once_matches_asking_each_chunk(seed: int) -> None:
    """chunk_groups and servable answer from what a frozen plan computes once (the scheduler
    asks them for each of a 16k prompt's 512 chunks); for every kind of plan that must be what
    asking each group about each chunk gives."""
    rng = random.Random(seed)
    for _ in range(200):
        bs = rng.choice((16, 32))
        ct = bs * rng.randint(1, 8)
        pool = [
            full(0, bs),
            sliding(1, rng.randint(2, 6 * ct), bs),
            sliding(2, rng.randint(2 * ct, 8 * ct), bs),
            chunked(3, bs * rng.randint(1, 12), bs),
            G.GroupPlan(4, G.STATE, bs, offload=False, reason="state"),
        ]
        groups = tuple(g for g in pool if rng.random() < 0.6) or (full(0, bs),)
        plan = G.Plan(groups, ct)
        for c in range(12):
            expected = [(g, *r) for g in plan.offloaded if (r := g.stored_range(c, ct)) is not None]
            assert list(plan.chunk_groups(c)) == expected
        assert plan.varies_by_chunk == any(g.kind == G.CHUNKED for g in plan.offloaded)
        for _ in range(20):
            local = rng.randint(0, 6 * ct // bs) * bs
            end = local + rng.randint(1, 4 * ct // bs) * bs
            assert plan.servable(local, end) == _servable_by_blocks(plan, local, end), (plan, local, end)
