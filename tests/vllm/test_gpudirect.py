"""GPU-direct L3 without a GPU: path selection, the cuFile/hipFile call sequence (fake library),
chunk files shared with the daemon's disk tier, ADOPT, and fallback reporting.

The fake library (``fake_cufile.py``) implements the same C functions with POSIX I/O on host
memory, so the worker's whole GPU-direct path runs here on CPU tensors against a real daemon.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_cufile import FakeFileLib
from test_gpu_path import B, gpu_worker, per_layer_nhd

from infera.engine.vllm.config import ConnectorEnv, read_env
from infera.engine.vllm.worker.gpu import gpudirect
from infera.engine.vllm.worker.gpu.gdfiles import ChunkFiles, gpu_wsum31
from infera.engine.vllm.worker.gpu.gpudirect import CUFILE, HIPFILE, FileApi, HostFacts, select
from infera.kvd import chunkfile as cf

GOOD = HostFacts(nvidia_fs=True, amdgpu_version=None, fs_type=lambda p: "ext4")
COMPAT = HostFacts(nvidia_fs=False, amdgpu_version=None, fs_type=lambda p: "ext4")


def choose(
    tmp_path: Path, ais: str, *, facts: HostFacts = GOOD, lib: Any = None, **kw: Any
) -> gpudirect.Selection:
    args: dict[str, Any] = dict(device_type="cuda", rocm=False, chunk_bytes=4 << 20)
    args.update(kw)
    roots = kw.pop("roots", {"long": str(tmp_path)})
    args.pop("roots", None)
    return select(ais, roots, facts=facts, loader=lambda f: lib or FakeFileLib(f.prefix), **args)


def test_ais_semantics(tmp_path: Path) -> None:
    off = choose(tmp_path, "0")
    assert not off.requested and not off.active and not off.fallback
    auto_no_roots = choose(tmp_path, "auto", roots={})
    assert not auto_no_roots.requested
    ok = choose(tmp_path, "auto")
    assert ok.active and ok.path_name == "cufile" and not ok.fallback and not ok.reasons
    must = choose(tmp_path, "1")
    assert must.active and must.loud and not must.fallback
    rocm = choose(tmp_path, "1", rocm=True)
    assert rocm.active and rocm.path_name == "hipfile"


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"roots": {"short": "/x"}}, "no long=DIR"),
        ({"device_type": "cpu"}, "not on a GPU"),
        ({"chunk_bytes": (4 << 20) + 512}, "alignment"),
        ({"facts": HostFacts(True, None, lambda p: "tmpfs")}, "filesystem tmpfs"),
        ({"facts": HostFacts(True, "6.14.14", lambda p: "xfs"), "rocm": True}, "older than 6.16.6"),
    ],
)
def test_every_fallback_has_its_reason(tmp_path: Path, kw: dict[str, Any], reason: str) -> None:
    sel = choose(tmp_path, "1", **kw)
    assert not sel.active and sel.fallback and sel.loud
    assert reason in (sel.reason() or ""), sel.reasons


def test_missing_library_and_driver(tmp_path: Path) -> None:
    def missing(flavor: gpudirect.Flavor) -> Any:
        raise OSError("no cufile library (libcufile.so.0 not found)")

    sel = select(
        "1",
        {"long": str(tmp_path)},
        device_type="cuda",
        rocm=False,
        chunk_bytes=4096,
        facts=GOOD,
        loader=missing,
    )
    assert not sel.active and "no driver/library" in (sel.reason() or "")
    broken = FakeFileLib(open_error=5030)
    sel = choose(tmp_path, "1", lib=broken)
    assert not sel.active and "error 5030" in (sel.reason() or "")


def test_a_volume_cufile_cannot_register_turns_it_off_at_start(tmp_path: Path) -> None:
    """What the H200 VM does: the driver opens, every HandleRegister fails with 5027."""
    lib = FakeFileLib(register_error=5027)
    sel = choose(tmp_path, "1", facts=COMPAT, lib=lib)
    assert not sel.active and sel.fallback and "error 5027" in (sel.reason() or "")
    assert lib.names()[-1] == "DriverClose" and not os.listdir(tmp_path), "probe file removed"


def test_compat_mode_is_detected_and_reported(tmp_path: Path) -> None:
    auto = choose(tmp_path, "auto", facts=COMPAT)
    assert not auto.active and auto.fallback and "compat mode" in (auto.reason() or "")
    assert not auto.loud, "auto falls back quietly (still reported)"
    must = choose(tmp_path, "1", facts=COMPAT)
    assert must.active and must.compat and must.fallback and must.path_name == "cufile-compat"
    assert "nvidia-fs" in (must.reason() or "")


def test_binding_call_sequence_and_hipfile_names(tmp_path: Path) -> None:
    for flavor in (CUFILE, HIPFILE):
        lib = FakeFileLib(flavor.prefix)
        api = FileApi(lib, flavor)
        api.driver_open()
        files = ChunkFiles(api, str(tmp_path / flavor.name), "ns/one")
        src = torch.randint(0, 255, (8192,), dtype=torch.uint8)
        path = files.write(b"k" * 32, src)
        out = torch.zeros_like(src)
        files.read(b"k" * 32, out)
        assert torch.equal(out, src)
        api.driver_close()
        names = lib.names()
        assert names[0] == "DriverOpen" and names[-1] == "DriverClose"
        assert names[1:4] == ["HandleRegister", "Write", "HandleDeregister"]
        assert names[4:7] == ["HandleRegister", "Read", "HandleDeregister"]
        reg = next(c for c in lib.calls if c[0] == "HandleRegister")
        assert reg[1] == gpudirect.HANDLE_TYPE_OPAQUE_FD
        write = next(c for c in lib.calls if c[0] == "Write")
        assert write[2:] == (8192, cf.HEADER_SIZE, 0), "payload from device offset 0 to file offset 4096"
        assert not lib.handles, "every handle is deregistered"
        assert path == cf.chunk_path(str(tmp_path / flavor.name), "ns/one", b"k" * 32)


def test_files_are_the_disk_tiers_format_both_ways(tmp_path: Path) -> None:
    api = FileApi(FakeFileLib(), CUFILE)
    files = ChunkFiles(api, str(tmp_path), "vllm/m/abc")
    src = torch.randint(0, 255, (3 * 4096,), dtype=torch.uint8)
    path = files.write(b"\x01" * 32, src)
    header, payload = cf.read_chunk(path, digest=cf.ns_digest("vllm/m/abc"), key=b"\x01" * 32)
    assert header.algo == cf.ALGO_WSUM31 and payload == src.numpy().tobytes(), (
        "the daemon verifies it (numpy)"
    )
    assert header.payload_checksum == gpu_wsum31(src) == cf.wsum31(payload)
    # a file the daemon wrote (xxh3) is read straight into "device" memory and verified on the host
    cf.write_chunk(str(tmp_path), "vllm/m/abc", b"\x02" * 32, payload)
    out = torch.zeros_like(src)
    files.read(b"\x02" * 32, out)
    assert torch.equal(out, src) and files.counters["gd_verify_on_host"] == 1
    # corruption is caught before the bytes are used
    with open(path, "r+b") as fh:
        fh.seek(cf.HEADER_SIZE + 100)
        fh.write(b"\xff\x00\xff")
    with pytest.raises(cf.CorruptChunk):
        files.read(b"\x01" * 32, torch.zeros_like(src))
    with pytest.raises(FileNotFoundError):
        files.read(b"\x03" * 32, torch.zeros_like(src))


def test_env_parsing() -> None:
    env = read_env(
        {
            "INFERA_KVD_AIS": "1",
            "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/kvd",
            "INFERA_KVD_GPU_STAGING_MB": "64",
        }
    )
    assert (
        env.gpu_direct_requested
        and env.hipfile_roots == {"long": "/nvme/kvd"}
        and env.gpu_staging_bytes == 64 << 20
    )
    assert not read_env({"INFERA_KVD_REGISTER": "0"}).register


# -- the worker end to end, on CPU tensors with the fake library, against a real daemon ----------------
@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> FakeFileLib:
    lib = FakeFileLib()
    monkeypatch.setattr(gpudirect, "load_library", lambda flavor: lib)
    monkeypatch.setattr(gpudirect, "host_facts", lambda: GOOD)
    return lib


def _row(daemon: Any) -> dict[str, Any]:
    with daemon.client(want_arena=False) as c:
        return next(cl for cl in c.stats()["clients"] if cl["role"] == "vllm-worker-0")


def test_worker_writes_files_itself_adopts_them_and_reads_them_back(
    start_daemon: Any, short_tmp: Path, fake_host: FakeFileLib
) -> None:
    root = short_tmp / "long"
    d = start_daemon("--max-bytes", "64M", "--long-path", str(root), "--long-bytes", "256M")
    env = ConnectorEnv(socket=d.socket, ais="1", hipfile_roots={"long": str(root)})
    from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob

    caches = per_layer_nhd(L=4, N=16, D=16)
    w = gpu_worker(d.socket, env=env)
    w.register(caches)
    assert w.gd is not None and w.gd.active
    src = [[1, 2], [5, 6], [9, 10]]
    hashes = [bytes([i + 1]) * 16 for i in range(3)]
    w.save(
        InferaKvdMetadata(
            saves=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(hashes, src, strict=True)])]
        )
    )
    w.gpu.drain()
    w.gd.drain()
    with d.client(want_arena=False) as c:
        long = c.stats()["tiers"]["long"]
    assert long["adopted"] == 3 and long["files_written"] == 0, "the daemon indexed our files, wrote none"
    assert long["chunks"] == 3
    w._report(force=True)
    w.link.client().ping()
    row = _row(d)
    assert row["data_path"] == "arena-pinned+cufile" and not row["fallback"]
    assert row["counters"]["gd_write_chunks"] == 3
    d.restart()  # RAM is empty: the chunks exist only as files
    before = {n: t.clone() for n, t in caches.items()}
    dst = [[20, 21], [22, 23], [24, 25]]
    w.load(
        InferaKvdMetadata(
            loads=[RequestJob("r", [ChunkJob(h, ids) for h, ids in zip(hashes, dst, strict=True)])]
        )
    )
    w.gpu.drain()
    assert not w.take_load_errors()
    for n, t in caches.items():
        for s, dd in zip(src, dst, strict=True):
            assert torch.equal(t[dd], before[n][s])
    assert w.counters["load_direct_chunks"] == 3 and w.gd.files.counters["gd_read_chunks"] == 3
    with d.client(want_arena=False) as c:
        st = c.stats()
    assert st["misses_total"] == 0 and st.get("gets_direct_total") == 3, "direct reads are not daemon misses"
    assert st["tiers"]["long"]["hits"] == 0, "the daemon read nothing itself"
    w.close()


def test_daemon_on_another_path_is_a_loud_fallback(
    start_daemon: Any, short_tmp: Path, fake_host: FakeFileLib, caplog: pytest.LogCaptureFixture
) -> None:
    (short_tmp / "mine").mkdir()
    d = start_daemon("--max-bytes", "64M", "--long-path", str(short_tmp / "theirs"), "--long-bytes", "64M")
    env = ConnectorEnv(socket=d.socket, ais="1", hipfile_roots={"long": str(short_tmp / "mine")})
    w = gpu_worker(d.socket, env=env)
    w.register(per_layer_nhd(L=4, N=16, D=16))
    w.link.client().ping()
    row = _row(d)
    assert row["fallback"] and row["requested_path"] == "gpu-direct"
    assert row["data_path"] == "arena-pinned" and "is not the daemon's --long-path" in row["fallback_reason"]
    assert any(r.levelname == "WARNING" and "GPU-direct is off" in r.message for r in caplog.records)
    w.close()


def test_compat_mode_worker_reports_it(
    start_daemon: Any, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = FakeFileLib()
    monkeypatch.setattr(gpudirect, "load_library", lambda flavor: lib)
    monkeypatch.setattr(gpudirect, "host_facts", lambda: COMPAT)
    root = short_tmp / "long"
    d = start_daemon("--max-bytes", "64M", "--long-path", str(root), "--long-bytes", "64M")
    w = gpu_worker(d.socket, env=ConnectorEnv(socket=d.socket, ais="1", hipfile_roots={"long": str(root)}))
    w.register(per_layer_nhd(L=4, N=16, D=16))
    w.link.client().ping()
    row = _row(d)
    assert row["data_path"] == "arena-pinned+cufile-compat" and row["fallback"]
    assert "compat mode" in row["fallback_reason"]
    w.close()


def test_failed_write_is_handed_back_to_the_daemon(
    start_daemon: Any, short_tmp: Path, fake_host: FakeFileLib
) -> None:
    root = short_tmp / "long"
    d = start_daemon("--max-bytes", "64M", "--long-path", str(root), "--long-bytes", "256M")
    w = gpu_worker(d.socket, env=ConnectorEnv(socket=d.socket, ais="1", hipfile_roots={"long": str(root)}))
    w.register(per_layer_nhd(L=4, N=16, D=16))
    assert w.gd is not None

    def broken(*a: Any, **k: Any) -> str:
        raise OSError(28, "No space left on device")

    w.gd.files.write = broken  # type: ignore[method-assign]
    from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob

    w.save(InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(b"\x07" * 16, [3, 4])])]))
    w.gpu.drain()
    w.gd.drain()
    deadline = __import__("time").monotonic() + 10
    while True:
        with d.client(want_arena=False) as c:
            long = c.stats()["tiers"]["long"]
        if long["files_written"] == 1 or __import__("time").monotonic() > deadline:
            break
        __import__("time").sleep(0.05)
    assert long["files_written"] == 1, "the daemon wrote the chunk through instead"
    assert w.gd.counters["gd_write_handed_back"] == 1
    assert os.listdir(root / cf.VERSION_DIR)
    w.close()
    assert B == 40


def test_a_failed_direct_read_is_served_by_the_daemon(
    start_daemon: Any, short_tmp: Path, fake_host: FakeFileLib
) -> None:
    """The file may be fine and only the GPU-direct read broken: the daemon reads it instead
    (it verifies wsum31 with numpy), so the chunk is a hit, not a recompute."""
    from infera.engine.vllm.metadata import ChunkJob, InferaKvdMetadata, RequestJob

    root = short_tmp / "long"
    d = start_daemon("--max-bytes", "64M", "--long-path", str(root), "--long-bytes", "256M")
    caches = per_layer_nhd(L=4, N=16, D=16)
    w = gpu_worker(d.socket, env=ConnectorEnv(socket=d.socket, ais="1", hipfile_roots={"long": str(root)}))
    w.register(caches)
    assert w.gd is not None and w.gd.active
    src = [[1, 2], [5, 6], [9, 10]]
    hashes = [bytes([i + 40]) * 16 for i in range(3)]
    w.save(
        InferaKvdMetadata(saves=[RequestJob("r", [ChunkJob(h, s) for h, s in zip(hashes, src, strict=True)])])
    )
    w.gpu.drain()
    w.gd.drain()
    d.restart()

    def broken(key: bytes, out: Any) -> Any:
        raise gpudirect.GpuDirectError("cuFileRead failed: error 5011")

    w.gd.files.read = broken  # type: ignore[method-assign]
    before = {n: t.clone() for n, t in caches.items()}
    dst = [[20, 21], [22, 23], [24, 25]]
    w.load(
        InferaKvdMetadata(loads=[RequestJob("r", [ChunkJob(h, x) for h, x in zip(hashes, dst, strict=True)])])
    )
    w.gpu.drain()
    assert not w.take_load_errors()
    for n, t in caches.items():
        for s, x in zip(src, dst, strict=True):
            assert torch.equal(t[x], before[n][s])
    assert w.counters["load_direct_retried"] == 3 and w.gd.counters["gd_read_errors"] == 3
    with d.client(want_arena=False) as c:
        assert c.stats()["tiers"]["long"]["hits"] == 3, "the daemon read and verified the files"
    w.close()
