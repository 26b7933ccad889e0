"""PREWARM answers with the long tier's measured read rate (what a load policy that stopped
loading from a tier learns it from), against real daemons with a disk tier; and a client that
floods PREWARM with keys that are, are not and cannot be there never hurts a healthy client."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from hostile import HealthProbe, enough_rounds, frame, hello, raw, read_reply
from test_disk_tier import NS, after_kill_9, disk_daemon, long_stats, on_disk

from helpers import Daemon
from infera.engine.vllm.scheduler.loadcost import CostModel, choose_load
from infera.engine.vllm.scheduler.policy import LoadPolicy
from infera.kvd.client import KvdClient
from infera.kvd.process import wait_until


class Link:
    """What the scheduler half's link does for the policy: run a call on a connected client."""

    def __init__(self, client: KvdClient) -> None:
        self.client = client

    def call(self, fn: Callable[[KvdClient], object]) -> object:
        return fn(self.client)


def test_prewarm_answers_with_the_read_rate(start_daemon: Callable[..., Daemon], short_tmp: Path) -> None:
    d = disk_daemon(start_daemon, short_tmp / "long")
    data = on_disk(d, 8, 256 << 10)
    with after_kill_9(d) as c:
        assert long_stats(c)["read_gbps"] is None  # nothing read since the start
        queued, rate = c.prewarm_rate(list(data))
        assert queued == 8 and rate is None
        wait_until(lambda: long_stats(c)["prewarmed"] == 8, 15, "prewarmed chunks in RAM")
        wait_until(lambda: long_stats(c)["reads_in_flight"] == 0, 15, "reads done")
        measured = long_stats(c)["read_gbps"]
        assert measured is not None and measured > 0
        queued, rate = c.prewarm_rate(list(data))  # all in RAM now: nothing queued, the rate known
        assert queued == 0 and rate is not None and abs(rate - measured) <= 0.001 + measured * 1e-6
        # the rate is what those reads achieved: 2 MiB can't have taken longer than the test
        assert rate > 2 * (256 << 10) * 8 / 1e9 / 60
        assert all(c.get(k) == v for k, v in data.items())


def test_a_tier_judged_slower_is_measured_again(start_daemon: Callable[..., Daemon], short_tmp: Path) -> None:
    """auto stops loading from a disk it believes slow (10 kB/s); the daemon's reads of the
    chunks it prewarmed instead tell the cost model the real rate, and the same hit is loaded
    next time. No request waited for the measurement."""
    size, ct = 256 << 10, 256
    d = disk_daemon(start_daemon, short_tmp / "long")
    data = on_disk(d, 8, size)
    keys = list(data)
    costs = CostModel(chunk_bytes=size, gbps={"ram": 20.0, "disk": 1e-5}, prefill_tps=30_000.0)
    counters: dict[str, int] = {}
    policy = LoadPolicy("auto", costs, counters)
    tiers = dict.fromkeys(range(8), "disk")
    with after_kill_9(d) as c:
        choice = policy.cut(0, 8 * ct, ct, set(range(8)), "disk")
        assert choice.load_end == 0 and choice.prewarm == list(range(8))
        policy.prewarm(Link(c), keys, [1] * 8, choice.prewarm, "disk")
        assert counters["timing_tier_rate_samples"] == 0  # nothing read yet: nothing learned
        wait_until(lambda: long_stats(c)["read_gbps"] is not None, 15, "the prewarm's reads")
        policy.prewarm(Link(c), keys, [1] * 8, choice.prewarm, "disk")
        assert counters["timing_tier_rate_samples"] == 1
        assert costs.long_per_chunk("disk") < size / 1e4 / 10  # far faster than the belief
        assert choose_load("auto", 0, 8 * ct, ct, tiers, costs).load_end == 8 * ct


def _flood(path: str, keys: list[bytes], stop: threading.Event, errors: list[str], sent: list[int]) -> None:
    """PREWARM as fast as the daemon takes it: real keys, absent keys, a lying key list, and
    a frame cut off in the middle, then again on a new connection."""
    bad_keys = [{"keys": "not-a-list"}, {"keys": [1, 2, 3]}, {"keys": [b"x" * 5000]}, {}]
    rid = 10
    while not stop.is_set():
        try:
            s = raw(path)
            hello(s, namespace=NS)
            for i in range(200):
                rid += 1
                absent = [f"absent-{rid}-{j}".encode() for j in range(64)]
                msg: dict[str, object] = {"op": "PREWARM", "id": rid, "keys": keys + absent}
                if i % 5 == 4:
                    msg = {"op": "PREWARM", "id": rid, **bad_keys[i % len(bad_keys)]}
                s.sendall(frame(msg))
                reply = read_reply(s)
                sent[0] += 1
                if reply.get("id") != rid:
                    errors.append(f"reply to {rid}: {reply}")
                    return
            s.sendall(frame({"op": "PREWARM", "id": rid + 1, "keys": keys})[:7])  # cut mid-frame
            s.close()
        except OSError as exc:
            errors.append(f"flood: {exc}")
            return


def test_a_prewarm_flood_never_hurts_a_healthy_client(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    d = disk_daemon(start_daemon, short_tmp / "long")
    data = on_disk(d, 16, 64 << 10)
    with after_kill_9(d) as c:
        stop = threading.Event()
        errors: list[str] = []
        sent = [0]
        flood = threading.Thread(target=_flood, args=(d.socket, list(data), stop, errors, sent), daemon=True)
        with HealthProbe(d.socket) as probe:
            flood.start()
            enough_rounds(probe, rounds=60)
            stop.set()
            flood.join(20)
            probe.assert_healthy()
        assert not errors, errors[:3]
        assert sent[0] >= 200, sent  # the flood ran the whole time
        assert all(c.get(k) == v for k, v in data.items())  # the prewarmed chunks are right too
        assert d.alive()
