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
from connector_kit import engine_facts, worker_half

from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.gpu.copier import ArenaPin
from infera.engine.vllm.worker.half import WorkerHalf
from infera.kvd.process import wait_until

B = 16
FACTS = engine_facts(model="/m/wl", head_size=8, block_size=4)


def caches() -> dict[str, torch.Tensor]:
    return {f"model.layers.{i}.attn": torch.randn(B, 2, 4, 8).to(torch.bfloat16) for i in range(2)}


def worker(sock: str, calls: list[str], register: Callable[[], None] = lambda: None) -> WorkerHalf:
    w = worker_half(FACTS, 8, sock, B, name="wl", gpu_path_on_cpu=True)  # chunks of 2 blocks of 4 tokens

    def reg(_ptr: int, _size: int) -> None:
        calls.append(f"reg:{threading.current_thread().name}")
        register()

    w.pin = ArenaPin(
        register=reg, unregister=lambda _p: calls.append(f"unreg:{threading.current_thread().name}")
    )
    return w


def test_worker_reconnects_between_steps_and_serves_the_next_one(daemon: Any) -> None:
    calls: list[str] = []
    kv = caches()
    w = worker(daemon.socket, calls)
    w.register(kv)
    assert w.arena is not None and calls == ["reg:MainThread"]
    daemon.restart()
    # no step in between: the watcher drops the old mapping and maps the new daemon's arena
    wait_until(lambda: w.link.connected and len(calls) == 3, 1.0, "the worker")
    assert calls[1:] == ["unreg:kvd-link-vllm-worker-0", "reg:kvd-link-vllm-worker-0"]
    assert w.arena is not None
    assert any(c["name"] == "wl" and c["role"] == "vllm-worker-0" for c in daemon.stats()["clients"])
    src, dst = [1, 2], [9, 10]
    w.save(InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(b"\x01" * 16, src)])]))
    assert daemon.stats()["sets_total"] == 1, "the first step after the restart saves"
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
    wait_until(lambda: not w.link.connected, 1.0, "the worker")
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
