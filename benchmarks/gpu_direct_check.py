"""GPU-direct L3 round trip on a real GPU host (cuFile on NVIDIA, hipFile on AMD).

    python benchmarks/gpu_direct_check.py [--root DIR] [--chunks 8] [--chunk-mib 16] [--json OUT]

1. What selection sees: nvidia-fs loaded or not (compat mode), the filesystem of ``--root``, the
   library, and the outcome for ``INFERA_KVD_AIS=auto`` and ``=1``.
2. Chunk files written from GPU memory and read back into other GPU memory through the backend
   (timed, compared byte for byte); one of them verified by the daemon's own code on the CPU; a
   daemon-written (xxh3) file read straight into GPU memory.
3. The worker end to end: GPU KV blocks saved with ``INFERA_KVD_AIS=1`` (the connector writes the
   files and ADOPTs them), the daemon restarted (RAM empty), the chunks loaded back through the
   backend into other blocks and compared; what the daemon reports for that worker.

``--fake`` runs the same steps on CPU tensors with the test suite's fake library (a dry run).
Exit status 0 only if every comparison held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--root", default=None, help="directory for chunk files (default: a new one under /var/tmp)"
    )
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-mib", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fake", action="store_true", help="CPU dry run with the fake library")
    ap.add_argument("--buffered", action="store_true", help="open chunk files without O_DIRECT")
    ap.add_argument("--any-fs", action="store_true", help="skip the filesystem check (experiments on tmpfs)")
    args = ap.parse_args()

    import torch

    from infera.engine.vllm.worker.gpu import gdfiles
    from infera.engine.vllm.worker.gpu import gpudirect as gd
    from infera.kvd import chunkfile as cf

    if args.fake:
        sys.path.insert(0, str(ROOT / "tests" / "vllm"))
        from fake_cufile import FakeFileLib

        fake_lib = FakeFileLib()
        gd.load_library = lambda flavor: fake_lib  # type: ignore[assignment]
    dev = torch.device("cpu" if args.fake else "cuda")
    root = Path(args.root or tempfile.mkdtemp(prefix="kvd-gd-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"root": str(root), "ok": True}
    facts = gd.host_facts()
    out["host"] = {
        "nvidia_fs_loaded": facts.nvidia_fs,
        "filesystem": facts.fs_type(str(root)),
        "amdgpu": facts.amdgpu_version,
    }
    try:
        lib = gd.load_library(gd.CUFILE)
        out["host"]["library"] = getattr(lib, "_name", "fake")
    except OSError as exc:
        out["host"]["library"] = f"not found: {exc}"
    rocm = getattr(torch.version, "hip", None) is not None
    try:  # the raw calls first, whatever selection decides
        flavor = gd.HIPFILE if rocm else gd.CUFILE
        raw = gd.FileApi(gd.load_library(flavor), flavor)
        raw.driver_open()
        out["probe"] = probe(raw, root, torch, dev)
    except Exception as exc:
        out["probe"] = {"error": f"{type(exc).__name__}: {exc}"}
        print("probe failed:", out["probe"]["error"])
    cb = args.chunk_mib << 20
    sels = {}
    for ais in ("auto", "1"):
        f = gd.HostFacts(facts.nvidia_fs, facts.amdgpu_version, lambda p: "ext4") if args.any_fs else facts
        s = gd.select(ais, {"long": str(root)}, device_type="cuda", rocm=rocm, chunk_bytes=cb, facts=f)
        sels[ais] = s
        out[f"select_{ais}"] = {
            "active": s.active,
            "path": s.path_name,
            "compat": s.compat,
            "fallback": s.fallback,
            "reason": s.reason(),
        }
        print(
            f"INFERA_KVD_AIS={ais}: active={s.active} path={s.path_name or '-'} fallback={s.fallback} reason={s.reason()}"
        )
    if args.any_fs:
        forced = gd.HostFacts(facts.nvidia_fs, facts.amdgpu_version, lambda p: "ext4")
        gd.host_facts = lambda: forced  # type: ignore[assignment]
    sel = sels["1"]
    if not sel.active or sel.api is None:
        print("GPU-direct is not usable here; nothing more to check")
        out["ok"] = False
        return finish(out, args.json)

    # 2. chunk files from and into GPU memory
    try:
        files = gdfiles.ChunkFiles(
            sel.api, str(root / "files"), "bench/gpu-direct-check", direct=not args.buffered
        )
        src = [torch.randint(0, 256, (cb,), dtype=torch.uint8, device=dev) for _ in range(args.chunks)]
        keys = [os.urandom(32) for _ in src]
        t = time.perf_counter()
        paths = [files.write(k, s) for k, s in zip(keys, src, strict=True)]
        w_s = time.perf_counter() - t
        dst = torch.empty(cb, dtype=torch.uint8, device=dev)
        if dev.type == "cuda":
            os.sync()
            try:
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
            except OSError:
                pass
        t = time.perf_counter()
        same = True
        for k, s in zip(keys, src, strict=True):
            files.read(k, dst)
            same = same and bool(torch.equal(dst, s))
        r_s = time.perf_counter() - t
        total = cb * len(src)
        header, payload = cf.read_chunk(paths[0])
        daemon_ok = header.algo == cf.ALGO_WSUM31 and payload == src[0].cpu().numpy().tobytes()
        cf.write_chunk(str(root / "files"), "bench/gpu-direct-check", b"\x05" * 32, payload)
        files.read(b"\x05" * 32, dst)
        xxh_ok = bool(torch.equal(dst, src[0])) and files.counters.get("gd_verify_on_host") == 1
        out["files"] = {
            "write_gbps": total / w_s / 1e9,
            "read_gbps": total / r_s / 1e9,
            "bytes": total,
            "same_bytes": same,
            "daemon_verifies_gpu_checksum": daemon_ok,
            "reads_daemon_xxh3_file": xxh_ok,
            "counters": files.counters,
        }
        print(
            f"{len(src)} x {args.chunk_mib} MiB through {sel.path_name}: write {out['files']['write_gbps']:.2f} GB/s, "
            f"read (page cache dropped) {out['files']['read_gbps']:.2f} GB/s; bytes equal: {same}; "
            f"daemon verifies the GPU checksum: {daemon_ok}; xxh3 file read + host verify: {xxh_ok}"
        )
        out["ok"] = out["ok"] and same and daemon_ok and xxh_ok
    except Exception as exc:
        out["ok"] = False
        out["files_error"] = f"{type(exc).__name__}: {exc}"
        print("chunk file round trip failed:", out["files_error"])
    try:
        out["worker"] = worker_round_trip(root / "tier", dev, args.fake)
    except Exception as exc:
        out["worker"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print("worker round trip failed:", out["worker"]["error"])
    out["ok"] = out["ok"] and out["worker"]["ok"]
    for log in (Path("cufile.log"),):
        if log.exists():
            out["cufile_log"] = log.read_text(errors="replace")[-3000:]
    return finish(out, args.json)


def probe(api: Any, root: Path, torch: Any, dev: Any) -> dict[str, Any]:
    """Which open flags cuFile accepts here, its version, and its own log (cufile.log in the cwd)."""
    import ctypes

    res: dict[str, Any] = {"library": getattr(api.lib, "_name", "?")}
    ver = ctypes.c_int(0)
    fn = getattr(api.lib, f"{api.flavor.prefix}GetVersion", None)
    if fn is not None:
        try:
            fn(ctypes.byref(ver))
            res["version"] = ver.value
        except Exception as exc:
            res["version"] = str(exc)
    path = root / "probe.bin"
    path.write_bytes(b"\0" * (1 << 20))
    buf = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)
    for name, flags in (
        ("O_RDWR|O_DIRECT", os.O_RDWR | os.O_DIRECT),
        ("O_RDWR", os.O_RDWR),
        ("O_RDONLY|O_DIRECT", os.O_RDONLY | os.O_DIRECT),
        ("O_WRONLY|O_DIRECT", os.O_WRONLY | os.O_DIRECT),
        ("O_RDONLY", os.O_RDONLY),
    ):
        fd = os.open(path, flags)
        try:
            h = api.register_fd(fd)
            n = api.read(h, buf.data_ptr(), 1 << 20, 0, 0) if "WRONLY" not in name else None
            api.deregister(h)
            res[name] = f"ok (read {n})"
        except Exception as exc:
            res[name] = str(exc)
        finally:
            os.close(fd)
    for log in (Path("cufile.log"), Path.home() / "cufile.log"):
        if log.exists():
            res["cufile_log"] = log.read_text(errors="replace")[-3000:]
    print("probe:", json.dumps(res, indent=1))
    return res


def worker_round_trip(root: Path, dev: Any, fake: bool) -> dict[str, Any]:
    import torch

    from infera.bench.transfer import solo_worker
    from infera.engine.vllm.config import ConnectorEnv
    from infera.engine.vllm.keys import EngineFacts, make_namespace
    from infera.engine.vllm.link import DaemonLink
    from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob
    from infera.kvd.process import DaemonProcess

    L, H, N, D, B = 8, 8, 16, 128, 256
    facts = EngineFacts(
        model="/bench/gd", model_type="llama", num_layers=L, total_kv_heads=H, kv_heads_per_rank=H, head_size=D,
        use_mla=False, dtype="bfloat16", kv_cache_dtype="auto", block_size=N, hash_block_size=N,
        bytes_per_token=L * H * 2 * D * 2, tp_size=1, pp_size=1, hash_algo="sha256", hash_seed="env:0",
        vllm_version="0.26", platform="cuda",
    )  # fmt: skip
    ns = make_namespace(facts, 4 * N)  # 4 blocks per chunk: 8 MiB chunks
    tmp = Path(tempfile.mkdtemp(prefix="kvd-gdw-", dir="/tmp"))
    d = DaemonProcess(
        str(tmp / "kvd.sock"),
        ["--max-bytes", "1G", "--long-path", str(root), "--long-bytes", "4G"],
        tmp / "kvd.log",
    ).start()
    env = ConnectorEnv(socket=d.socket, ais="1", hipfile_roots={"long": str(root)})
    link = DaemonLink(d.socket, ns, role="vllm-worker-0", name="gd-check", model="/bench/gd", want_arena=True)
    w = solo_worker(ns, env, link, B, N, gpu_path_on_cpu=fake)
    kv = {
        f"model.layers.{i}.attn": torch.randn(B, N, H, 2 * D, device=dev)
        .to(torch.bfloat16)
        .permute(0, 2, 1, 3)
        for i in range(L)
    }
    w.register(kv)
    res: dict[str, Any] = {"ok": False}
    if w.gd is None or not w.gd.active:
        res["error"] = f"the worker did not take GPU-direct: {w.report_fields().get('fallback_reason')}"
        print(res["error"])
        d.stop()
        return res
    n = 16
    src = [list(range(4 * i, 4 * i + 4)) for i in range(n)]
    dst = [list(range(128 + 4 * i, 128 + 4 * i + 4)) for i in range(n)]
    hashes = [os.urandom(16) for _ in range(n)]
    t = time.perf_counter()
    w.save(
        InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(h, s) for h, s in zip(hashes, src, strict=True)])])
    )
    w.gpu.drain()
    w.gd.drain()
    res["save_and_write_s"] = time.perf_counter() - t
    with d.client(want_arena=False) as c:
        res["long_after_save"] = {
            k: c.stats()["tiers"]["long"].get(k) for k in ("adopted", "files_written", "chunks", "bytes_used")
        }
    w._report(force=True)
    w.link.client().ping()
    with d.client(want_arena=False) as c:
        row = next(cl for cl in c.stats()["clients"] if cl["role"] == "vllm-worker-0")
    res["daemon_sees"] = {
        k: row.get(k) for k in ("data_path", "requested_path", "fallback", "fallback_reason")
    }
    d.restart()
    t = time.perf_counter()
    w.load(
        InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(h, x) for h, x in zip(hashes, dst, strict=True)])])
    )
    if dev.type == "cuda":
        torch.cuda.synchronize()
    res["direct_load_s"] = time.perf_counter() - t
    errors = w.take_load_errors()
    flat_s = [b for s in src for b in s]
    flat_d = [b for x in dst for b in x]
    same = not errors and all(bool(torch.equal(t_[flat_s], t_[flat_d])) for t_ in kv.values())
    with d.client(want_arena=False) as c:
        st = c.stats()
    res.update(
        same_bytes=same,
        load_errors=len(errors),
        gets_direct_total=st.get("gets_direct_total"),
        misses_total=st.get("misses_total"),
        counters={
            k: v for k, v in w.report_fields()["counters"].items() if k.startswith(("gd_", "load_direct"))
        },
    )
    res["ok"] = bool(
        same and res["long_after_save"]["adopted"] == n and res["long_after_save"]["files_written"] == 0
    )
    print(f"worker: {json.dumps(res, default=str)}")
    w.close()
    d.stop()
    return res


def finish(out: dict[str, Any], path: str | None) -> int:
    if path:
        Path(path).write_text(json.dumps(out, indent=1, default=str))
    print("GPU-DIRECT CHECK", "OK" if out["ok"] else "FAILED")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
