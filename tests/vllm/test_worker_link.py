"""The worker half across a daemon restart: its link reconnects in the background, the arena
mapping is swapped (unregistered, remapped, registered) by the watcher thread between steps,
never during one, and the next step saves and loads on the new daemon.

Runs on CPU tensors (the GPU copy path's code with synchronous stand-ins, as test_gpu_path.py);
needs torch, not a running engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from infera.engine.vllm.config import ConnectorEnv
from infera.engine.vllm.keys import EngineFacts, make_namespace
from infera.engine.vllm.link import DaemonLink
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.gpu.copier import ArenaPin
from infera.engine.vllm.worker.half import WorkerHalf

B = 16
FACTS = EngineFacts(
    model="/m/wl", model_type="llama", num_layers=2, total_kv_heads=2, kv_heads_per_rank=2, head_size=8,
    use_mla=False, dtype="bfloat16", kv_cache_dtype="auto", block_size=4, hash_block_size=4,
    bytes_per_token=128, tp_size=1, pp_size=1, hash_algo="sha256", hash_seed="fixed", vllm_version="0.32",
    platform="cpu",
)  # fmt: skip


def caches() -> dict[str, torch.Tensor]:
    return {f"model.layers.{i}.attn": torch.randn(B, 2, 4, 8).to(torch.bfloat16) for i in range(2)}


def worker(sock: str, calls: list[str], register: Callable[[], None] = lambda: None) -> WorkerHalf:
    ns = make_namespace(FACTS, 8)  # 2 blocks of 4 tokens
    link = DaemonLink(sock, ns, role="vllm-worker-0", name="wl", model="/m/wl", want_arena=True)
    w = WorkerHalf(
        ns,
        ConnectorEnv(socket=sock),
        rank=0,
        replicated=False,
        link=link,
        blockers=[],
        num_blocks=B,
        block_size=4,
        gpu_path_on_cpu=True,
    )

    def reg(_ptr: int, _size: int) -> None:
        calls.append(f"reg:{threading.current_thread().name}")
        register()

    w.pin = ArenaPin(
        register=reg, unregister=lambda _p: calls.append(f"unreg:{threading.current_thread().name}")
    )
    return w


def wait_until(pred: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.01)


def stats(daemon: Any) -> dict[str, Any]:
    with daemon.client(want_arena=False) as c:
        return dict(c.stats())


def test_worker_reconnects_between_steps_and_serves_the_next_one(daemon: Any) -> None:
    calls: list[str] = []
    kv = caches()
    w = worker(daemon.socket, calls)
    w.register(kv)
    assert w.arena is not None and calls == ["reg:MainThread"]
    daemon.restart()
    # no step in between: the watcher drops the old mapping and maps the new daemon's arena
    wait_until(lambda: w.link.connected and len(calls) == 3, 1.0)
    assert calls[1:] == ["unreg:kvd-link-vllm-worker-0", "reg:kvd-link-vllm-worker-0"]
    assert w.arena is not None
    assert any(c["name"] == "wl" and c["role"] == "vllm-worker-0" for c in stats(daemon)["clients"])
    src, dst = [1, 2], [9, 10]
    w.save(InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(b"\x01" * 16, src)])]))
    assert stats(daemon)["sets_total"] == 1, "the first step after the restart saves"
    before = {n: t.clone() for n, t in kv.items()}
    w.load(InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(b"\x01" * 16, dst)])]))
    assert w.take_load_errors() == set()
    for n, t in kv.items():
        assert torch.equal(t[dst], before[n][src])
    assert w.link.counters["connects"] == 2
    watcher = w.link._watcher
    w.close()
    assert watcher is not None and not watcher.is_alive()


def test_a_restart_during_a_step_waits_for_the_step(daemon: Any) -> None:
    """The mapping a step copies from is not taken away under it: the watcher's teardown waits."""
    calls: list[str] = []
    w = worker(daemon.socket, calls)
    w.register(caches())
    with w.link.using() as usable:
        assert usable
        arena = w.arena
        daemon.kill()
        time.sleep(0.3)
        assert w.arena is arena and w.link.connected, "still mapped while the step runs"
        assert calls == ["reg:MainThread"]
    wait_until(lambda: not w.link.connected, 1.0)
    assert w.arena is None and calls[-1].startswith("unreg:")
    w.close()


def test_a_step_during_a_reconnect_waits_to_load_and_skips_its_saves(daemon: Any) -> None:
    """While the watcher registers the new mapping (slow on a GPU: ~45 ms per GiB), a step's loads
    wait for it (vLLM was promised those tokens) and its saves are skipped at once."""
    calls: list[str] = []
    registering = threading.Event()
    release = threading.Event()

    def slow() -> None:
        if threading.current_thread().name != "MainThread":
            registering.set()
            release.wait(5)

    w = worker(daemon.socket, calls, register=slow)
    w.register(caches())
    daemon.restart()
    assert registering.wait(2)
    started = time.monotonic()
    w.save(InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(b"\x03" * 16, [5, 6])])]))
    assert time.monotonic() - started < 0.5
    assert w.counters["save_skipped_unavailable"] == 1
    done = threading.Event()

    def load() -> None:
        w.load(InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(b"\x02" * 16, [3, 4])])]))
        done.set()

    loader = threading.Thread(target=load)
    loader.start()
    assert not done.wait(0.3), "the load must wait for the registration"
    release.set()
    assert done.wait(5)
    loader.join()
    assert w.link.connected
    assert w.take_load_errors() == {3, 4}  # that chunk was never stored: a miss, after the wait
    assert w.counters["load_failed_missing"] == 1
    w.close()
