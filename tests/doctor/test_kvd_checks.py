"""The memory, limits, leftovers, disk-namespace, cuFile and arena-sharing checks: each one's pass and
fail on fixture trees (kvd-container-ok / -bad, nvidia-h100 / nvidia-no-nvfs, and variants made in a
copy), and on this machine with real daemons."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from infera.doctor.checks import leftovers as leftovers_check
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.facts.kvdconf import parse_flag_words, settings
from infera.doctor.run import run_doctor

OK, BAD = "kvd-container-ok", "kvd-container-bad"


def one(hosts: Any, name: str, check: str, **kw: Any) -> Any:
    return hosts.run(name, checks=[check], **kw).get(check).result


def _write(tree: Path, rel: str, text: str) -> None:
    p = tree / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


# -- the daemon's settings ------------------------------------------------------------------------


def test_flag_words_are_read_like_the_daemon_reads_them() -> None:
    v = parse_flag_words(
        ["--max-bytes=16G", "--allow-uid", "1000", "--allow-uid=1001", "--prefault", "x", "--fsync"]
    )
    assert v.values == {"max_bytes": "16G", "allow_uid": ["1000", "1001"], "prefault": True}
    assert v.given == {"--max-bytes", "--allow-uid", "--prefault", "--fsync"}


def test_settings_come_from_the_running_daemon_then_from_kvd_doctor(hosts: Any) -> None:
    ctx = hosts.context(OK)
    s = settings(ctx)
    assert s.pid == 4242 and s.get("max_bytes") == 16 << 30 and s.where("max_bytes") == "kvd daemon pid 4242"
    assert s.get("prefault") is True and s.get("long_path") == "/nvme/kvd-long"
    assert s.where("fsync") == "default"
    mine = settings(hosts.context(OK, daemon_flags={"max_bytes": "128G"}))
    assert mine.get("max_bytes") == 128 << 30 and mine.where("max_bytes") == "kvd doctor --max-bytes"


# -- cgroup-memory ---------------------------------------------------------------------------------


def test_cgroup_limit_below_the_arena_fails_and_says_how_much(hosts: Any) -> None:
    r = one(hosts, BAD, "cgroup-memory")
    assert r.status.value == "fail" and "512.0 MiB" in r.summary and "16.0 GiB" in r.summary
    assert "OOM" in r.summary and "16.2 GiB" in (r.fix or "")
    assert any("/sys/fs/cgroup/memory.max" in e.source for e in r.evidence)


def test_cgroup_limit_that_fits_the_arena_but_not_the_daemon_warns(hosts: Any) -> None:
    tree = hosts.copy(OK)
    _write(tree, "sys/fs/cgroup/memory.max", f"{(16 << 30) + (100 << 20)}\n")
    r = one(hosts, OK, "cgroup-memory", tree=tree)
    assert r.status.value == "warn" and "may not" in r.summary


def test_memory_high_below_the_need_warns(hosts: Any) -> None:
    tree = hosts.copy(OK)
    _write(tree, "sys/fs/cgroup/memory.max", "max\n")
    _write(tree, "sys/fs/cgroup/memory.high", f"{8 << 30}\n")
    r = one(hosts, OK, "cgroup-memory", tree=tree)
    assert r.status.value == "warn" and "memory.high" in r.summary


def test_kvd_doctor_flags_are_what_is_judged(hosts: Any) -> None:
    r = one(hosts, OK, "cgroup-memory", daemon_flags={"max_bytes": "100G"})
    assert r.status.value == "fail" and "100.0 GiB" in r.summary
    assert any("kvd doctor --max-bytes" in e.value for e in r.evidence)


def test_cgroup_v1_limit_and_its_unlimited_value(hosts: Any) -> None:
    tree = hosts.copy(OK)
    (tree / "sys/fs/cgroup/cgroup.controllers").unlink()
    _write(tree, "proc/4242/cgroup", "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    _write(tree, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    _write(tree, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", f"{8 << 30}\n")
    r = one(hosts, OK, "cgroup-memory", tree=tree)
    assert r.status.value == "fail" and "cgroup" in r.summary and "8.0 GiB" in r.summary
    _write(tree, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    r = one(hosts, OK, "cgroup-memory", tree=tree)
    assert r.status.value == "ok" and "no memory limit" in r.summary and "cgroup v1 /docker/abc" in r.summary


def test_an_arena_larger_than_ram_fails(hosts: Any) -> None:
    r = one(hosts, OK, "cgroup-memory", daemon_flags={"max_bytes": "1T"})
    assert r.status.value == "fail" and "larger than this host's RAM" in r.summary


def test_cgroup_memory_on_this_machine_reads_a_real_cgroup() -> None:
    ctx = Context(
        DoctorOptions(checks=["cgroup-memory"], daemon_flags={"max_bytes": "64M"}), processes=lambda: []
    )
    r = run_doctor(ctx=ctx).get("cgroup-memory").result
    assert r.status.value in ("ok", "warn", "fail"), r.summary
    assert any("cgroup" in e.source for e in r.evidence)


# -- dev-shm ---------------------------------------------------------------------------------------


def test_dev_shm_small_and_stale_files_warn_with_their_names(hosts: Any) -> None:
    r = one(hosts, BAD, "dev-shm")
    assert r.status.value == "warn" and "64.0 MiB" in r.summary
    for name in ("vllm_offload_0_4f1c2a.mmap", "psm_deadbeef", "nccl-AbCd12"):
        assert name in r.summary and name in (r.fix or "")
    assert "unrelated.dat" not in r.summary, "only vLLM's, NCCL's and our files are judged"
    assert any("memfd" in d for d in r.details)


def test_dev_shm_file_an_engine_holds_is_in_use_and_stale_once_it_is_gone(hosts: Any) -> None:
    assert one(hosts, OK, "dev-shm").status.value == "ok"
    tree = hosts.copy(OK)
    (tree / "proc/5001/fd/12").unlink()
    r = one(hosts, OK, "dev-shm", tree=tree)
    assert r.status.value == "warn" and "psm_1a2b3c4d" in r.summary


def test_dev_shm_on_this_machine() -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    ctx = Context(DoctorOptions(checks=["dev-shm"]), processes=lambda: [])
    r = run_doctor(ctx=ctx).get("dev-shm").result
    assert r.status.value in ("ok", "warn") and any(e.source.startswith("statvfs") for e in r.evidence)


# -- memlock ---------------------------------------------------------------------------------------


def test_memlock_below_the_rdma_registration_fails(hosts: Any) -> None:
    r = one(hosts, BAD, "memlock")
    assert r.status.value == "fail" and "64.0 KiB" in r.summary and "Mooncake RDMA" in r.summary
    assert "memlock" in (r.fix or "") and "CAP_IPC_LOCK" in (r.fix or "")


def test_memlock_unlimited_or_cap_ipc_lock_passes_rdma(hosts: Any) -> None:
    tree = hosts.copy(BAD)
    limits = tree / "proc/4242/limits"
    limits.write_text(
        re.sub(r"(Max locked memory\s+)65536\s+65536", r"\1unlimited unlimited", limits.read_text())
    )
    assert one(hosts, BAD, "memlock", tree=tree).status.value == "ok"
    tree = hosts.copy(BAD)
    status = tree / "proc/4242/status"
    status.write_text(status.read_text().replace("CapEff:\t00000000a80425fb", "CapEff:\t00000000a80465fb"))
    r = one(hosts, BAD, "memlock", tree=tree)
    assert r.status.value == "ok" and "CAP_IPC_LOCK" in r.summary


def test_memlock_with_nothing_registered_passes_and_rdma_nics_warn(hosts: Any) -> None:
    assert one(hosts, OK, "memlock").status.value == "ok"
    tree = hosts.copy(OK)
    limits = tree / "proc/4242/limits"
    limits.write_text(
        limits.read_text().replace(
            "unlimited                 unlimited", "8388608                 8388608", 1
        )
    )
    (tree / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    r = one(hosts, OK, "memlock", tree=tree)
    assert r.status.value == "warn" and "mlx5_0" in r.summary


# -- hugepages -------------------------------------------------------------------------------------


def test_huge_pages_that_leave_no_room_fail_and_tight_ones_warn(hosts: Any) -> None:
    r = one(hosts, BAD, "hugepages")
    assert r.status.value == "fail" and "56.0 GiB" in r.summary and "nr_hugepages" in (r.fix or "")
    r = one(hosts, BAD, "hugepages", daemon_flags={"max_bytes": "6800M"})
    assert r.status.value == "warn"
    ok = one(hosts, OK, "hugepages")
    assert (
        ok.status.value == "ok" and "does not ask for hugetlb pages" in ok.summary and "advise" in ok.summary
    )


# -- cufile-config ---------------------------------------------------------------------------------


def test_gpu_direct_without_nvidia_fs_in_compat_mode_fails(hosts: Any) -> None:
    r = one(hosts, "nvidia-no-nvfs", "cufile-config", environ={"INFERA_KVD_AIS": "1"})
    assert r.status.value == "fail"
    assert "silently runs every read in compat mode" in r.summary and "max_direct_io_size_kb 512" in r.summary
    assert "modprobe nvidia-fs" in (r.fix or "")


def test_gpu_direct_auto_without_nvidia_fs_warns(hosts: Any) -> None:
    env = {"INFERA_KVD_AIS": "auto", "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/kvd-long"}
    assert one(hosts, "nvidia-no-nvfs", "cufile-config", environ=env).status.value == "warn"


def test_gpu_direct_with_nvidia_fs_passes_and_without_the_request_skips(hosts: Any) -> None:
    r = one(hosts, "nvidia-h100", "cufile-config", environ={"INFERA_KVD_AIS": "1"})
    assert r.status.value == "ok" and "nvidia-fs mode" in r.summary
    skipped = one(hosts, "nvidia-no-nvfs", "cufile-config")
    assert skipped.status.value == "skip" and "if turned on" in skipped.summary


def test_p2pdma_mode_needs_no_multipath_and_force_compat_fails(hosts: Any) -> None:
    tree = hosts.copy("nvidia-no-nvfs")
    cf = tree / "etc/cufile.json"
    cf.write_text(cf.read_text().replace('"use_pci_p2pdma": false', '"use_pci_p2pdma": true'))
    _write(tree, "sys/module/nvme_core/parameters/multipath", "Y\n")
    r = one(hosts, "nvidia-no-nvfs", "cufile-config", tree=tree, environ={"INFERA_KVD_AIS": "1"})
    assert r.status.value == "fail" and "multipath" in r.summary and "nvidia_fs" not in r.summary
    _write(tree, "sys/module/nvme_core/parameters/multipath", "N\n")
    cf.write_text(cf.read_text().replace('"max_direct_io_size_kb" : 512', '"max_direct_io_size_kb" : 16384'))
    assert (
        one(hosts, "nvidia-no-nvfs", "cufile-config", tree=tree, environ={"INFERA_KVD_AIS": "1"}).status.value
        == "ok"
    )
    cf.write_text(cf.read_text().replace('"force_compat_mode": false', '"force_compat_mode": true'))
    r = one(hosts, "nvidia-no-nvfs", "cufile-config", tree=tree, environ={"INFERA_KVD_AIS": "1"})
    assert r.status.value == "fail" and "force_compat_mode" in r.summary


# -- leftovers -------------------------------------------------------------------------------------


def test_leftovers_on_the_fixture_hosts(hosts: Any) -> None:
    ok = one(hosts, OK, "leftovers")
    assert ok.status.value == "ok" and "1 in use" in ok.summary
    r = one(hosts, BAD, "leftovers")
    assert r.status.value == "fail"
    assert "/tmp/infera-kvd-0/kvd.sock is a regular file" in r.summary
    assert (
        "kvd daemon pid 4242 holds /run/kvd/kvd.sock.lock but its socket /run/kvd/kvd.sock is gone"
        in r.summary
    )
    assert "leftover lock file /tmp/infera-kvd-1000/kvd.sock.lock (pid 999 is not running)" in r.summary


def test_a_stale_socket_on_this_machine_is_found_by_connecting(short_tmp: Path) -> None:
    path = str(short_tmp / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    Path(path + ".lock").write_text("999999999\n")
    ctx = Context(
        DoctorOptions(socket=path, socket_explicit=True, checks=["leftovers"]), processes=lambda: []
    )
    r = run_doctor(ctx=ctx).get("leftovers").result
    # the check also looks at this machine's default paths, where a test run beside this one may
    # have left something of its own: only this socket's finding is this test's
    assert f"stale socket {path}: nothing listens on it" in r.summary and f"rm {path}" in (r.fix or "")
    (finding,) = leftovers_check._look(ctx, path, "--socket", [])
    assert finding.status.value == "warn"


def test_a_live_daemon_socket_is_no_leftover(daemon: Any) -> None:
    ctx = Context(
        DoctorOptions(socket=daemon.socket, socket_explicit=True, checks=["leftovers"]), processes=lambda: []
    )
    r = run_doctor(ctx=ctx).get("leftovers").result
    assert daemon.socket not in r.summary or r.status.value == "ok", r.summary
    assert any(e.source == daemon.socket and "a running kvd daemon" in e.value for e in r.evidence)


# -- arena-sharing ---------------------------------------------------------------------------------


def test_more_than_one_uid_says_namespaces_are_no_security_boundary(hosts: Any) -> None:
    r = one(hosts, BAD, "arena-sharing")
    assert r.status.value == "warn" and "1000, 1001" in r.summary
    assert "not a security boundary" in r.summary and "daemon each" in (r.fix or "")
    assert one(hosts, OK, "arena-sharing").status.value == "ok"
    anyone = one(hosts, OK, "arena-sharing", daemon_flags={"allow_uid": ["*"]})
    assert anyone.status.value == "warn" and "any local uid" in anyone.summary


# -- disk-namespaces -------------------------------------------------------------------------------


def test_disk_namespaces_on_the_fixture_hosts(hosts: Any) -> None:
    ok = one(hosts, OK, "disk-namespaces", long_path="/nvme/kvd-long")
    assert ok.status.value == "ok" and "1 namespace (16.0 KiB)" in ok.summary
    r = one(hosts, BAD, "disk-namespaces", long_path="/nvme/kvd-long")
    assert r.status.value == "warn"
    assert "2 namespaces" in r.summary and "needs the daemon" in r.summary
    assert (
        "1 leftover temporary file (4.9 KiB)" in r.summary
        and "1 corrupt chunk file in quarantine" in r.summary
    )
    texts = " ".join(e.value for e in r.evidence)
    assert "w:1a2b3c4d" in texts and "w:9f8e7d6c" in texts, "the namespace files name the weights"


def _wait(pred: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_namespaces_no_connected_engine_uses_are_reclaimable(start_daemon: Any, short_tmp: Path) -> None:
    long = short_tmp / "long"
    d = start_daemon("--max-bytes", "64M", "--long-path", str(long), "--long-bytes", "64M")
    old, new = "vllm/tiny/w:00000001/" + "a" * 32, "vllm/tiny/w:00000002/" + "b" * 32
    with d.client(namespace=old, role="vllm-scheduler", name="old-engine") as c:
        c.put(b"o" * 32, b"x" * 8192)
    engine = d.client(namespace=new, role="vllm-scheduler", name="new-engine")
    try:
        engine.put(b"n" * 32, b"y" * 8192)

        def written() -> bool:
            with d.client(want_arena=False) as c:
                return int(c.stats()["tiers"]["long"]["chunks"]) >= 2

        _wait(written)
        young = next((long / "v1").glob("*/*/")) / ".fresh-0001.tmp"
        young.write_bytes(b"t" * 100)  # a write in progress: not a leftover while the daemon serves
        ctx = Context(
            DoctorOptions(socket=d.socket, socket_explicit=True, checks=["disk-namespaces"]),
            processes=lambda: [],
        )
        r = run_doctor(ctx=ctx).get("disk-namespaces").result
    finally:
        engine.close()
    assert r.status.value == "warn", r.summary
    assert "1 namespace no connected engine uses" in r.summary and old in r.summary and new not in r.summary
    assert "temporary" not in r.summary
    assert any("(in use)" in e.value and new in e.value for e in r.evidence)
    assert "stop the daemon" in (r.fix or "")
