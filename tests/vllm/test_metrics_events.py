"""The scheduler half's KV events and hit tiers against a real daemon, with vLLM's own event
classes: a planned save announces ``BlockStored`` (CPU) under vLLM's block hashes; a lookup that
finds the chunk only on the disk tier (after a daemon restart) moves it to the storage medium and
counts its tokens as ``disk``; a lookup that finds nothing removes it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as ext

from helpers import Daemon
from infera.engine.vllm.events import MEDIUM_LONG, MEDIUM_RAM, KvdEvents
from infera.engine.vllm.keys import Namespace, chunk_hashes, chunk_key
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import InferaKvdMetadata
from infera.engine.vllm.scheduler.half import SchedulerHalf

CT, BS = 64, 16  # chunk tokens, block size (= hash block size)
NS = Namespace("events-test", b"\x01" * 16, CT, {}, "fp", {})


def request(rid: str, n: int) -> Any:
    tokens = [(i * 7 + 3) % 997 for i in range(n)]
    hashes = [os.urandom(32) for _ in range(n // BS)]
    return SimpleNamespace(
        request_id=rid,
        num_tokens=n,
        num_prompt_tokens=n,
        prompt_token_ids=tokens,
        all_token_ids=tokens,
        block_hashes=hashes,
        kv_transfer_params=None,
        lora_request=None,
    )


def half(socket: str, events: KvdEvents) -> SchedulerHalf:
    link = DaemonLink(socket, NS, role="vllm-scheduler", name="vllm:t", model="t", want_arena=False)
    return SchedulerHalf(NS, block_size=BS, hash_block_size=BS, ranks=1, link=link, events=events)


def test_events_and_hit_tiers(start_daemon: Callable[..., Daemon], short_tmp: Path) -> None:
    long = short_tmp / "long"
    long.mkdir()
    d = start_daemon("--max-bytes", "8M", "--long-path", str(long), "--long-bytes", "32M")
    ev = KvdEvents(chunk_tokens=CT, hash_block_size=BS)
    req = request("r1", 3 * CT)  # 3 chunks; the last one cannot be loaded (the last token is computed)
    sched = half(d.socket, ev)
    st = sched._track(req)
    st.block_ids = [list(range(1, 3 * CT // BS + 1))]  # one group; block 0 is the null block
    sched._plan_saves("r1", st, 2 * CT, InferaKvdMetadata())
    stored = ev.take()
    assert [type(e) for e in stored] == [BlockStored, BlockStored]
    assert all(e.medium == MEDIUM_RAM and e.block_size == BS for e in stored)
    vh = [ext(h) for h in req.block_hashes]  # as vLLM's own GPU events spell them
    assert stored[0].block_hashes == vh[0:4] and stored[0].parent_block_hash is None
    assert stored[1].block_hashes == vh[4:8] and stored[1].parent_block_hash == vh[3]
    assert stored[1].token_ids == req.all_token_ids[CT : 2 * CT]

    # the daemon gets the two chunks (as the workers would store them), then restarts: disk only
    hashes = chunk_hashes(list(req.block_hashes), CT, BS, 3 * CT)
    with d.client(namespace=NS.name) as c:
        for h in hashes[:2]:
            assert c.put(chunk_key(NS.digest, h, 0), b"x" * 4096)
        deadline = time.monotonic() + 20
        while c.stats()["tiers"]["long"]["chunks"] < 2:
            assert time.monotonic() < deadline, "disk writes"
            time.sleep(0.05)
    sched.link.close()  # type: ignore[union-attr]
    d.restart()
    sched = half(d.socket, ev)
    hit, _ = sched.matched_tokens(req, 0)
    assert hit == 2 * CT
    moved = ev.take()
    assert [(type(e), e.medium) for e in moved] == [
        (BlockRemoved, MEDIUM_RAM),
        (BlockStored, MEDIUM_LONG),
        (BlockRemoved, MEDIUM_RAM),
        (BlockStored, MEDIUM_LONG),
    ]
    blocks = SimpleNamespace(get_block_ids=lambda: (list(range(1, 13)),))
    sched.after_alloc(req, blocks, hit)
    assert sched.hit_sources(req, hit) == {"disk": 2 * CT}
    assert sched.counters["hit_tokens_disk"] == 2 * CT and sched.counters["hit_tokens_ram"] == 0

    # now in RAM again (the load would have read them): a RAM hit; then gone: removed
    req2 = SimpleNamespace(**{**vars(req), "request_id": "r2"})
    with d.client(namespace=NS.name) as c:
        c.get_many([chunk_key(NS.digest, h, 0) for h in hashes[:2]])
        assert sched.matched_tokens(req2, 0)[0] == 2 * CT
        sched.after_alloc(req2, blocks, 2 * CT)
        assert sched.hit_sources(req2, 2 * CT) == {"ram": 2 * CT}
        assert ev.take() == []
        c.delete([chunk_key(NS.digest, h, 0) for h in hashes[:2]])
    req3 = SimpleNamespace(**{**vars(req), "request_id": "r3"})
    assert sched.matched_tokens(req3, 0) == (0, False)
    gone = ev.take()
    assert [(type(e), e.medium) for e in gone] == [(BlockRemoved, MEDIUM_LONG), (BlockRemoved, MEDIUM_LONG)]
    sched.link.close()  # type: ignore[union-attr]
