"""Cost-aware loading without vLLM: the decision with injected rates, the rates learned from
timings, the policy's counters and prewarm, and the environment switch."""

from __future__ import annotations

import time
from typing import Any

import pytest

from infera import loadreport
from infera.engine.vllm.config import parse_load_rates, read_env
from infera.engine.vllm.scheduler.loadcost import (
    MAX_LOAD_GBPS,
    MIN_CHUNK_SHARE,
    MIN_GAIN_S,
    MIN_GAIN_SHARE,
    CostModel,
    choose_load,
)
from infera.engine.vllm.scheduler.policy import LoadPolicy
from infera.engine.vllm.worker.timing import KvdWorkerMeta, Timings
from infera.errors import UsageError

CT = 256
MIB = 1 << 20
# an 8B model's chunk: 128 KiB per token, 32 MiB per 256-token chunk
CHUNK = 32 * MIB


def model(
    ram: float = 50.0, disk: float = 1.5, prefill: float = 30_000.0, fixed: float = 0.5e-3
) -> CostModel:
    return CostModel(
        chunk_bytes=CHUNK,
        gbps={"ram": ram, "disk": disk, "distributed": 1.0},
        prefill_tps=prefill,
        load_fixed_s=fixed,
    )


def test_a_fast_ram_hit_is_loaded_whole() -> None:
    got = choose_load("auto", 0, 16 * 1024, CT, ["ram"] * 64, model())
    assert got.load_end == 16 * 1024
    assert got.skipped == {} and got.prewarm == [] and got.reason == ""
    assert got.load_s < got.recompute_s


def test_a_slow_disk_hit_is_recomputed_and_prewarmed() -> None:
    # 64 chunks of 32 MiB at 1.5 GB/s: ~1.4 s against ~0.55 s of prefill
    got = choose_load("auto", 0, 16 * 1024, CT, ["disk"] * 64, model())
    assert got.load_end == 0
    assert got.reason == "slower"
    assert got.skipped == {"disk": 16 * 1024}
    assert got.prewarm == list(range(64))
    assert got.load_s > got.recompute_s


def test_a_fast_disk_hit_is_loaded() -> None:
    got = choose_load("auto", 0, 16 * 1024, CT, ["disk"] * 64, model(disk=20.0))
    assert got.load_end == 16 * 1024 and not got.prewarm


def test_ram_head_loads_and_slow_disk_tail_is_recomputed() -> None:
    tiers = ["ram"] * 8 + ["disk"] * 8
    got = choose_load("auto", 0, 16 * CT, CT, tiers, model())
    assert got.load_end == 8 * CT
    assert got.skipped == {"disk": 8 * CT}
    assert got.prewarm == list(range(8, 16))


def test_a_short_hit_with_a_costly_load_setup_is_recomputed() -> None:
    # one chunk: 256 tokens recompute in ~8.5 ms; a load that costs 20 ms to set up is slower
    got = choose_load("auto", 0, CT, CT, ["ram"], model(fixed=20e-3))
    assert got.load_end == 0 and got.skipped == {"ram": CT}
    assert got.prewarm == []  # a RAM chunk needs no promotion


def test_hit_starting_and_ending_inside_chunks() -> None:
    # the engine has 100 tokens itself; the hit ends 32 tokens into chunk 3
    got = choose_load("auto", 100, 3 * CT + 32, CT, {0: "ram", 1: "ram", 2: "disk", 3: "disk"}, model())
    assert got.load_end == 2 * CT  # the RAM chunks, not the slow disk ones
    assert got.skipped == {"disk": CT + 32}
    assert got.prewarm == [2, 3]


@pytest.mark.parametrize(("policy", "end", "reason"), [("always", 64 * CT, ""), ("never", 0, "policy")])
def test_forced_policies_ignore_the_rates(policy: str, end: int, reason: str) -> None:
    got = choose_load(policy, 0, 64 * CT, CT, ["disk"] * 64, model(disk=0.01))
    assert got.load_end == end and got.reason == reason
    assert got.prewarm == []  # only a judged-slower long-tier hit is promoted
    assert sum(got.skipped.values()) == 64 * CT - end


def test_defaults_until_measured_then_measurements() -> None:
    m = model(ram=20.0)
    assert m.ram_per_chunk() == pytest.approx(CHUNK / 20e9)
    for _ in range(20):  # loads of 8 chunks that take 8 ms: 1 ms per chunk after the fixed part
        m.observe_load(8, {}, 8e-3 + m.load_fixed_s)
    assert m.ram_per_chunk() == pytest.approx(1e-3, rel=0.01)
    for _ in range(20):  # disk loads of 4 chunks, 4 of them from disk, 44 ms: 10 ms extra each
        m.observe_load(4, {"disk": 4}, m.load_fixed_s + 4e-3 + 40e-3)
    assert m.long_per_chunk("disk") == pytest.approx(10e-3, rel=0.01)
    assert m.long_per_chunk("distributed") == pytest.approx(CHUNK / 1e9)  # not measured: default
    assert m.samples == {"ram": 20, "disk": 20}


def test_a_load_faster_than_the_fixed_cost_is_never_an_absurd_rate() -> None:
    """A CPU hit of one small chunk in 0.3 ms, under the assumed 0.5 ms fixed cost: the chunk was
    costed 0 s, which `kvd stat` showed as 131,072,000,000 MB/s, and `auto` priced every later
    RAM load at the fixed cost alone."""
    small = 128 << 10  # a 256-token chunk of the tiny test Llama
    m = CostModel(chunk_bytes=small)
    m.observe_load(1, {}, 0.3e-3)
    rate = m.summary()["load_rate_ram_mbps"]
    assert 0 < rate <= MAX_LOAD_GBPS * 1e3, rate
    assert rate == pytest.approx(small / (0.3e-3 * MIN_CHUNK_SHARE) / 1e6, rel=0.3)
    assert m.load_fixed_s < 0.5e-3, "a load faster than the fixed cost teaches a smaller one"
    # every RAM chunk costs time of its own: a load of more chunks is costed more
    one, many = m.load_seconds({"ram": 1}), m.load_seconds({"ram": 64})
    assert one > m.load_fixed_s and many > one + 60 * m.min_chunk_s()
    for _ in range(200):  # a stream of 0 s samples (a clock that did not move) stays bounded
        m.observe_load(4, {}, 0.0)
        m.observe_load(2, {"disk": 2}, 0.0)
        m.observe_tier_rate("disk", 1e12)
    rates = m.summary()
    assert all(0 < rates[f"load_rate_{t}_mbps"] <= MAX_LOAD_GBPS * 1e3 for t in ("ram", "disk")), rates
    assert m.ram_per_chunk() >= m.min_chunk_s() and m.long_per_chunk("disk") >= m.min_chunk_s()


def test_recompute_is_what_the_step_saves_by_step_size() -> None:
    m = model(prefill=1000.0)
    assert m.saved_seconds(1001, 1) == pytest.approx(1.0)  # the warm-up rate
    for _ in range(30):
        m.observe_step(1, 10e-3)  # decode: the fixed cost of a step
        m.observe_step(1024, 10e-3 + 1024 * 5e-6)  # 5 us per token up to 1k
        m.observe_step(8192, 10e-3 + 8192 * 20e-6)  # then steeper (attention)
    assert m.step_seconds(1) == pytest.approx(10e-3, rel=0.01)
    assert m.step_seconds(1024) == pytest.approx(15.12e-3, rel=0.01)
    assert m.saved_seconds(1025, 1) == pytest.approx(5.12e-3, rel=0.01)
    mid = m.step_seconds(4608)  # linear between the measured steps
    assert mid == pytest.approx((m.step_seconds(1024) + m.step_seconds(8192)) / 2, rel=0.01)
    # beyond the largest step: its last segment's slope
    slope = (m.step_seconds(8192) - m.step_seconds(1024)) / (8192 - 1024)
    assert m.step_seconds(16_384) == pytest.approx(m.step_seconds(8192) + 8192 * slope, rel=0.01)
    # so a 1k RAM hit whose load costs 8 ms is recomputed (5 ms saved), an 8k one is loaded
    m.ram_chunk_s, m.load_fixed_s = 2e-3, 0.0
    assert choose_load("auto", 0, 1024, CT, ["ram"] * 4, m, 1025).load_end == 0
    assert choose_load("auto", 0, 8192, CT, ["ram"] * 32, m, 8193).load_end == 8192
    assert m.summary()["prefill_rate_tps"] == pytest.approx(8192 / (8192 * 20e-6), rel=0.01)


def test_the_rest_of_the_prompt_is_computed_either_way() -> None:
    """A hit of 2k tokens before 6k new ones saves T(8k) - T(6k), not T(2k) - T(decode): the
    steeper part of the curve."""
    m = model()
    for n, sec in ((1, 10e-3), (2048, 30e-3), (6144, 110e-3), (8192, 170e-3)):
        m.observe_step(n, sec)
    alone = choose_load("auto", 0, 2048, CT, ["ram"] * 8, m, 2049)
    before_more = choose_load("auto", 0, 2048, CT, ["ram"] * 8, m, 8192)
    assert alone.recompute_s == pytest.approx(20e-3, rel=0.02)
    assert before_more.recompute_s == pytest.approx(60e-3, rel=0.02)


def test_a_launch_bound_engine_recomputes_short_hits() -> None:
    """H100 run N's steps (eager 8B, a slow host): a 1k-token step took no longer than a decode
    step, so a 1k hit saves nothing; a 2k step took 20 ms more, so a 2k hit is worth its ~6 ms
    load. The per-token model loaded the 1k hit (1.17x recompute) and recomputed the 2k one."""
    m = model(ram=43.0)
    m.chunk_bytes, m.load_fixed_s = 4 * MIB, 0.3e-3  # 32-token chunks of 4 MiB
    for _ in range(3):
        for n, ms in ((16, 27.0), (512, 26.0), (1024, 25.3), (2048, 48.0), (4096, 98.0), (8192, 206.0)):
            m.observe_step(n, ms / 1e3)
    assert m.step_seconds(1024) == pytest.approx(27e-3, rel=0.01), "T(n) never decreases"
    one_k = choose_load("auto", 0, 1008, 32, ["ram"] * 32, m, 1024)
    assert one_k.load_end == 0 and one_k.recompute_s == pytest.approx(0.0, abs=0.5e-3)
    two_k = choose_load("auto", 0, 2032, 32, ["ram"] * 64, m, 2048)
    assert two_k.load_end == 2032 and two_k.recompute_s > 2 * two_k.load_s


def test_a_hit_not_worth_a_ram_load_is_not_promoted() -> None:
    """A disk hit judged slower is promoted only when the same hit would be loaded from RAM:
    a short hit on a launch-bound engine would be recomputed from RAM too, and a PREWARM is a
    round trip on the scheduler's thread."""
    m = model()
    for n, sec in ((1, 27e-3), (1024, 27e-3), (16_384, 470e-3)):
        m.observe_step(n, sec)
    short = choose_load("auto", 0, 4 * CT, CT, ["disk"] * 4, m, 4 * CT + 1)
    assert short.load_end == 0 and short.prewarm == [] and short.unpromoted == 4
    assert short.skipped == {"disk": 4 * CT}
    long = choose_load("auto", 0, 64 * CT, CT, ["disk"] * 64, m, 64 * CT + 1)
    assert long.load_end == 0 and long.prewarm == list(range(64)) and long.unpromoted == 0
    counters: dict[str, int] = {}
    policy = LoadPolicy("auto", m, counters)
    assert policy.cut(0, 4 * CT, CT, {0, 1, 2, 3}, "disk", 4 * CT + 1).prewarm == []
    assert counters["prewarm_not_worth_chunks"] == 4
    assert counters["load_skipped_slower_tokens_disk"] == 4 * CT
    counters.update(policy.report())
    line = loadreport.summary(counters)
    assert line is not None and "4 chunks left in the long tier (too short to load)" in line


def test_a_hit_that_saves_less_than_the_margin_is_recomputed() -> None:
    """A short hit whose load is expected to save a fraction of a millisecond is recomputed: both
    sides are estimates, and on a launch-bound eager engine noise decides (H100 run K, 512 tokens).
    Just above the margin it loads."""
    m = model()
    m.ram_chunk_s, m.load_fixed_s = 0.6e-3, 0.3e-3  # 2 chunks: 1.5 ms of load
    load_s = 0.3e-3 + 2 * 0.6e-3
    need = load_s + MIN_GAIN_S + MIN_GAIN_SHARE * load_s
    m.step_base_s = 10e-3
    m.step_s = {9: (513.0, 10e-3 + need * 0.95)}  # saves 0.95 of (load + margin): not by enough
    got = choose_load("auto", 0, 512, CT, ["ram"] * 2, m, 513)
    assert got.load_end == 0 and got.reason == "slower" and got.skipped == {"ram": 512}
    assert got.recompute_s > got.load_s, "a load this close is faster on paper"
    m.step_s = {9: (513.0, 10e-3 + need * 1.05)}
    got = choose_load("auto", 0, 512, CT, ["ram"] * 2, m, 513)
    assert got.load_end == 512 and got.reason == ""


def test_a_ram_hit_is_not_cut_in_two_by_a_noisy_bucket() -> None:
    """Each prefix priced at its own bucket's rate: 2k tokens at 40 us (a noisy early step) was
    worth more than 4k at 12 us, so a 4k RAM hit recomputed its second half (run H on the H200).
    A noisy step longer than a bigger one does not make T(n) fall either."""
    m = model()
    m.step_base_s = 5e-3
    m.step_s = {11: (2048.0, 5e-3 + 2048 * 40e-6), 12: (4096.0, 5e-3 + 4096 * 12e-6)}
    assert m.step_seconds(4096) == pytest.approx(5e-3 + 2048 * 40e-6)
    m.ram_chunk_s, m.load_fixed_s = 1.5e-3, 0.0  # 16 chunks: 24 ms of load for ~82 ms saved
    got = choose_load("auto", 0, 4096, CT, ["ram"] * 16, m, 4097)
    assert got.load_end == 4096 and got.skipped == {}
    # a RAM head before a slow disk tail is still loaded alone
    m.long_chunk_s["disk"] = 50e-3
    got = choose_load("auto", 0, 4096, CT, ["ram"] * 8 + ["disk"] * 8, m, 4097)
    assert got.load_end == 2048 and got.skipped == {"disk": 2048}


class FakeLink:
    """Records PREWARM calls; ``down`` makes it act as an unreachable daemon."""

    def __init__(self, down: bool = False) -> None:
        self.prewarmed: list[bytes] = []
        self.down = down

    def call(self, fn: Any) -> Any:
        from infera.kvd.client import KvdUnavailable

        if self.down:
            raise KvdUnavailable("no daemon")
        return fn(self)

    def prewarm_rate(self, keys: list[bytes]) -> tuple[int, float | None]:
        self.prewarmed += keys
        return len(keys), None


def test_policy_counts_every_skip_by_tier_and_reason() -> None:
    counters: dict[str, int] = {}
    auto = LoadPolicy("auto", model(), counters)
    auto.cut(0, 16 * CT, CT, set(range(8, 16)), "disk")
    assert counters["load_skipped_slower_tokens_disk"] == 8 * CT
    assert counters["load_skipped_slower_tokens_ram"] == 0
    assert counters["load_partial_requests"] == 1 and counters["load_skipped_requests"] == 1
    never = LoadPolicy("never", model(), counters)
    never.cut(0, 4 * CT, CT, set(), "disk")
    assert counters["load_skipped_policy_tokens"] == 4 * CT
    assert counters["load_cost_checks"] == 2
    assert auto.report()["load_policy_auto"] == 1


def test_prewarm_asks_for_every_key_of_the_skipped_chunks() -> None:
    counters: dict[str, int] = {}
    policy = LoadPolicy("auto", model(), counters)
    keys = [bytes([i]) * 16 for i in range(6)]
    link = FakeLink()
    policy.prewarm(link, keys, [2, 2, 2], [1, 2], "disk")  # two keys per chunk (two ranks)
    assert link.prewarmed == keys[2:]
    assert counters["prewarm_chunks"] == 2
    policy.prewarm(FakeLink(down=True), keys, [2, 2, 2], [0], "disk")
    assert counters["prewarm_errors"] == 1 and counters["prewarm_chunks"] == 2


def test_worker_timings_reach_the_cost_model() -> None:
    t = Timings()
    t.chunk_bytes = CHUNK
    t.step_started(2048)
    t.step_ended()
    t.load_done(4, 0, 0.5)  # the process's first load: not a sample
    t.load_done(4, 1, 0.02)
    a = t.take()
    assert a is not None and t.take() is None  # taken once
    other = KvdWorkerMeta(loads=[(4, 1, 0.03)], steps=[], chunk_bytes=CHUNK)
    both = a.aggregate(other)  # two TP ranks
    assert len(both.loads) == 2 and len(both.steps) == 1
    counters: dict[str, int] = {}
    costs = CostModel(chunk_bytes=1)
    LoadPolicy("auto", costs, counters).observe(both, "disk")
    assert costs.chunk_bytes == CHUNK
    assert counters["timing_load_samples"] == 2 and counters["timing_step_samples"] == 1
    assert costs.samples["disk"] == 2 and costs.samples["prefill"] == 1
    assert a.loads[0] == (4, 1, 0.02) and t.counters["timing_first_load_dropped"] == 1


def test_a_slow_early_ram_estimate_is_probed_not_trusted() -> None:
    """A RAM rate from a slow first sample would make auto recompute every RAM hit, and a hit
    that is recomputed is never timed. While the rate rests on fewer than PROBE_SAMPLES loads,
    a RAM hit judged slower, but within PROBE_MAX_RATIO of recompute, is loaded to time it."""
    from infera.engine.vllm.scheduler import policy as P

    counters: dict[str, int] = {}
    costs = model(ram=2.0)  # 8 chunks at 2 GB/s ~ 17 ms, against ~8.7 ms to recompute 256 tokens
    costs.prefill_tps = 30_000.0
    auto = LoadPolicy("auto", costs, counters)
    first = choose_load("auto", 0, 8 * CT, CT, ["ram"] * 8, costs)
    assert first.load_end == 0 and first.load_s <= P.PROBE_MAX_RATIO * first.recompute_s
    for i in range(P.PROBE_SAMPLES):
        assert auto.cut(0, 8 * CT, CT, set(), "disk").load_end == 8 * CT
        assert counters["load_probe_requests"] == i + 1
    assert auto.cut(0, 8 * CT, CT, set(), "disk").load_end == 0  # probes are bounded
    assert counters["load_skipped_slower_tokens_ram"] == 8 * CT
    # measured: no probe, and none where a wrong guess would cost more than the ratio
    counters.clear()
    measured = model(ram=2.0)
    measured.samples["ram"] = P.PROBE_SAMPLES
    assert LoadPolicy("auto", measured, counters).cut(0, 8 * CT, CT, set(), "disk").load_end == 0
    slow = LoadPolicy("auto", model(ram=0.5), counters)
    assert slow.cut(0, 8 * CT, CT, set(), "disk").load_end == 0
    assert slow.cut(0, 8 * CT, CT, {0, 1}, "disk").skipped.get("disk")  # long tiers: never probed
    assert counters["load_probe_requests"] == 0


def test_a_new_daemon_forgets_what_its_long_tier_read_like() -> None:
    counters: dict[str, int] = {}
    costs = model()
    costs.observe_tier_rate("disk", 20.0)  # page-cached reads, before the restart
    policy = LoadPolicy("auto", costs, counters)
    fast = choose_load("auto", 0, 16 * CT, CT, ["disk"] * 16, costs)
    policy.forget_long_rates()
    assert costs.long_chunk_s == {} and counters["timing_long_rates_reset"] == 1
    cold = choose_load("auto", 0, 16 * CT, CT, ["disk"] * 16, costs)
    assert cold.load_s > 5 * fast.load_s  # back to the 1.5 GB/s warm-up default
    policy.forget_long_rates()
    assert counters["timing_long_rates_reset"] == 1  # nothing learned since: nothing to reset


def test_timed_steps_add_to_the_workers_counters() -> None:
    """A step without loads counts its CPU time (bind to wait_for_save) in the worker's counters;
    a step with loads (started with 0 tokens) is not timed."""
    counters: dict[str, int] = {}
    t = Timings(counters)
    t.step_started(16)
    time.sleep(0.01)
    t.step_ended()
    assert counters["step_timed"] == 1 and counters["step_cpu_us"] >= 10_000
    t.step_started(0)
    t.step_ended()
    assert counters["step_timed"] == 1
    assert "step_gpu_us" not in counters, "no GPU events on the CPU"


def test_the_environment_switch() -> None:
    assert read_env({}).load_policy == "always"  # auto is opt-in (docs/connector.md)
    assert read_env({"INFERA_KVD_LOAD_POLICY": "auto"}).load_policy == "auto"
    env = read_env({"INFERA_KVD_LOAD_POLICY": " Never ", "INFERA_KVD_LOAD_RATES": "disk=0.5,prefill=9000"})
    assert env.load_policy == "never"
    assert env.load_gbps == {"disk": 0.5} and env.prefill_tps == 9000
    with pytest.raises(UsageError, match="INFERA_KVD_LOAD_POLICY"):
        read_env({"INFERA_KVD_LOAD_POLICY": "sometimes"})
    with pytest.raises(UsageError, match="INFERA_KVD_LOAD_RATES"):
        read_env({"INFERA_KVD_LOAD_RATES": "tape=1"})
    for bad in ("ram=-1", "ram", "ram=1,ram=2", "prefill=1,disk=2,PREFILL=3"):
        with pytest.raises(UsageError, match="INFERA_KVD_LOAD_RATES"):
            parse_load_rates(bad)


def test_kvd_stat_and_top_show_the_skips() -> None:
    from infera.kvd.statctl import render_text
    from infera.tui.panels import warning_lines

    counters: dict[str, Any] = {}
    policy = LoadPolicy("auto", model(), counters)
    policy.cut(0, 3 * CT, CT, {0, 1, 2}, "disk")
    policy.prewarm(FakeLink(), [b"k" * 16] * 3, [1, 1, 1], [0, 1, 2], "disk")
    counters.update(policy.report())
    line = loadreport.summary(counters)
    assert line is not None
    assert "load policy auto" in line and "768 disk" in line and "3 chunks prewarmed" in line
    assert loadreport.summary({"load_chunks": 3}) is None  # a worker: no policy line
    sched = {"pid": 7, "name": "vllm:m", "role": "vllm-scheduler", "counters": counters}
    stats = {"clients": [sched, {"pid": 8, "role": "vllm-worker-0", "counters": {"load_chunks": 1}}]}
    assert line in render_text(stats)
    assert any(line in w for w in warning_lines(stats))
    counters[loadreport.SLOWER + "disk"] = 0
    assert not warning_lines(stats)  # nothing recomputed: no warning
