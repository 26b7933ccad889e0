"""The disk long tier against a hostile filesystem: full disks, planted files, planted symlinks.

Each test runs a healthy client (:class:`hostile.HealthProbe`) on the same daemon and asserts it
was served correct bytes within the deadline while the disk misbehaved.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from hostile import HealthProbe, enough_rounds
from hostile_fs import fill_up, tmpfs, tree_snapshot
from test_disk_tier import NS, disk_daemon, long_stats, wait_ready

from helpers import Daemon
from infera.kvd import chunkfile as cf
from infera.kvd.process import wait_until

N = 100
SIZE = 8 << 10  # 100 chunk files of 12 KiB fit a 2 MiB tmpfs once the filler is gone


def payloads(n: int = N, size: int = SIZE, prefix: str = "key") -> dict[bytes, bytes]:
    return {f"{prefix}-{i}".encode(): os.urandom(size) for i in range(n)}


def put_onto_full_disk(c, data: dict[bytes, bytes], n: int = N):  # type: ignore[no-untyped-def]
    """Put ``data`` as long chunks and wait until no write is queued and ``n`` have failed; returns
    the long tier's stats then."""
    for k, v in data.items():
        assert c.put(k, v)
    return wait_until(
        lambda: (s := long_stats(c))["queued_writes"] == 0 and s["failed_writes"] >= n and s,
        15,
        f"{n} failed writes",
    )


def read_back(d: Daemon, data: dict[bytes, bytes]) -> None:
    """Restart-side check: every chunk comes back from disk, byte-exact."""
    with d.client(namespace=NS) as c:
        wait_ready(c)
        got = {k: c.get(k) for k in data}
        missing = [k for k, v in got.items() if v is None]
        assert not missing, f"{len(missing)} of {len(data)} long chunks lost: {missing[:3]}"
        assert all(got[k] == v for k, v in data.items()), "wrong bytes read back"
        assert long_stats(c)["hits"] == len(data)


# -- item 10: failed writes are retried; a clean stop makes a last attempt ----------------------
def test_failed_writes_are_retried_once_space_is_back(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    with tmpfs(short_tmp / "small", "2m") as mnt:
        filler = fill_up(mnt)
        d = disk_daemon(start_daemon, Path(mnt), "64M", "64M")
        data = payloads()
        with HealthProbe(d.socket) as probe, d.client(namespace=NS) as c:
            s = put_onto_full_disk(c, data)
            assert s["files_written"] == 0 and s["unpersisted"] == N and s["state"] == "degraded"
            wait_until(lambda: long_stats(c)["write_retries"] >= 1, 15, "a retry while the disk is full")
            assert long_stats(c)["recovered_writes"] == 0
            os.unlink(filler)
            s = wait_until(
                lambda: (s := long_stats(c))["unpersisted"] == 0 and s["queued_writes"] == 0 and s,
                20,
                "retries after space came back",
            )
            assert s["recovered_writes"] == N and s["chunks"] == N and s["state"] == "ready"
            assert all(c.get(k) == v for k, v in data.items())
            enough_rounds(probe)
        probe.assert_healthy()
        d.kill()  # kill -9: what is on disk now got there through the retries
        d.start()
        read_back(d, data)
        d.stop()


def test_clean_stop_writes_chunks_whose_writes_failed(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    with tmpfs(short_tmp / "small", "2m") as mnt:
        filler = fill_up(mnt)
        # retries held back for a minute: only the final attempt at the clean stop can write them
        d = disk_daemon(start_daemon, Path(mnt), "64M", "64M", env={"INFERA_KVD_DISK_RETRY_S": "60"})
        data = payloads()
        with HealthProbe(d.socket) as probe, d.client(namespace=NS) as c:
            s = put_onto_full_disk(c, data)
            assert s["unpersisted"] == N and s["write_retries"] == 0
            os.unlink(filler)
            enough_rounds(probe)
        probe.assert_healthy()
        t0 = time.monotonic()
        assert d.stop() == 0
        assert time.monotonic() - t0 < 10
        assert re.search(rf"clean stop: {N} long chunks written, 0 not written", d.log()), d.log()[-2000:]
        d.start()
        read_back(d, data)
        d.stop()


def test_clean_stop_on_a_full_disk_counts_and_says_what_is_lost(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    with tmpfs(short_tmp / "small", "2m") as mnt:
        fill_up(mnt)
        # a 1 MiB arena cannot hold 100 chunks of 16 KiB: the oldest unwritten ones are evicted
        d = disk_daemon(start_daemon, Path(mnt), "1M", "64M", env={"INFERA_KVD_DISK_RETRY_S": "60"})
        with HealthProbe(d.socket, size=4 << 10) as probe, d.client(namespace=NS) as c:
            s = put_onto_full_disk(c, payloads(size=16 << 10), n=1)
            s = wait_until(lambda: (s := long_stats(c))["queued_writes"] == 0 and s, 15, "writes done")
            top = c.stats()
            evicted = top["long_unpersisted_evicted_total"]
            assert evicted > 0 and evicted == s["evicted_unwritten"]
            assert s["unpersisted"] + evicted == N, "every long chunk is either waiting or counted lost"
            enough_rounds(probe)
        probe.assert_healthy()
        left = s["unpersisted"]
        assert d.stop() == 0
        log = d.log()
        assert re.search(rf"clean stop: 0 long chunks written, {left} not written", log), log[-2000:]
        assert "No space left" in log


def test_a_clean_stop_after_the_disk_filled_up_mid_run_exits_0(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    """Chunks written, then the filesystem fills and the next writes fail: a SIGTERM still ends
    in exit status 0. It used to end in a BufferError traceback and status 1, the arena's
    mapping being closed while a failed write's buffer was still referenced."""
    with tmpfs(short_tmp / "small", "8m") as mnt:
        d = disk_daemon(start_daemon, Path(mnt), "4M", "6M")
        with HealthProbe(d.socket, size=4 << 10) as probe, d.client(namespace=NS) as c:
            first = payloads(4, 512 << 10, "first")
            for k, v in first.items():
                assert c.put(k, v)
            wait_until(
                lambda: long_stats(c)["chunks"] >= 4 and long_stats(c)["queued_writes"] == 0, 15, "written"
            )
            fill_up(mnt)
            put_onto_full_disk(c, payloads(4, 512 << 10, "second"), n=1)
            enough_rounds(probe)
        probe.assert_healthy()
        assert d.stop() == 0, d.log()[-3000:]
        log = d.log()
        assert "Traceback" not in log and "BufferError" not in log, log[-3000:]
        assert "No space left" in log


def test_retry_back_off_probes_one_at_a_time_and_wakes_all_on_recovery() -> None:
    from infera.kvd.tiers.writeretry import Retries

    now = [0.0]
    r = Retries(1.0, 30.0, clock=lambda: now[0])
    keys = [f"k{i}".encode() for i in range(5)]
    for k in keys:
        r.failed(k, retried=False)
    assert len(r) == 5 and r.due() == [], "nothing before 1 s"
    now[0] = 1.0
    probe = r.due()
    assert len(probe) == 1 and r.due() == [], "while failing, one probe at a time"
    r.failed(probe[0], retried=True)
    now[0] = 1.5
    assert r.due() == [], "the next probe waits the probe gap (1 s, then 2 s...)"
    now[0] = 2.0
    second = r.due()
    assert len(second) == 1 and second != probe
    r.failed(second[0], retried=True)
    now[0] = 3.9
    assert r.due() == []
    now[0] = 4.0
    third = r.due()
    assert len(third) == 1
    assert not r.succeeded(b"unrelated", retried=False)  # a fresh write of another key worked
    assert r.succeeded(third[0], retried=True), "a retry that worked: recovered"
    rest = r.due()
    assert sorted(rest) == sorted(set(keys) - set(third)), "recovery makes every waiting key due"
    for k in rest:
        r.succeeded(k, retried=True)
    assert len(r) == 0 and r.inflight == 0

    # one key failing alone backs off 1, 2, 4 ... 30 s; a dropped key is never handed out again
    r.failed(b"bad", retried=False)
    waits = []
    for _ in range(7):
        due_at = min(e[0] for e in r.waiting.values())
        waits.append(due_at - now[0])
        now[0] = max(due_at, now[0] + 60)  # past any probe gap too
        assert r.due() == [b"bad"]
        r.failed(b"bad", retried=True)
    assert waits == [1, 2, 4, 8, 16, 30, 30]
    r.drop(b"bad")
    now[0] += 100
    assert r.due() == [] and len(r) == 0


# -- item 11: non-regular, short and bad-header files are never indexed -------------------------
def plant_bad_files(root: Path, outside: Path) -> tuple[dict[bytes, bytes], list[bytes], list[bytes]]:
    """Three good chunks, five non-regular entries and seven corrupt files, all under valid
    chunk-file names. Returns (good payloads, non-regular keys, corrupt keys)."""
    good = {f"good-{i}".encode(): os.urandom(3000) for i in range(3)}
    for k, v in good.items():
        cf.write_chunk(str(root), NS, k, v, sync="none")

    def path(key: bytes) -> Path:
        p = Path(cf.chunk_path(str(root), NS, key))
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    outside.mkdir()
    elsewhere = Path(cf.write_chunk(str(outside), NS, b"sym-valid", os.urandom(3000), sync="none"))
    os.mkfifo(outside / "fifo")
    path(b"sym-valid").symlink_to(elsewhere)  # following it would find a well-formed chunk
    path(b"sym-dangling").symlink_to(outside / "nowhere")
    path(b"sym-fifo").symlink_to(outside / "fifo")
    path(b"dir").mkdir()
    os.mkfifo(path(b"fifo"))
    irregular = [b"sym-valid", b"sym-dangling", b"sym-fifo", b"dir", b"fifo"]

    header = cf.make_header(NS, b"almost", b"x" * 1000).pack()
    path(b"empty").write_bytes(b"")
    path(b"short").write_bytes(b"y" * 100)
    path(b"almost").write_bytes(header[: cf.HEADER_SIZE - 1])
    path(b"garbage").write_bytes(os.urandom(cf.HEADER_SIZE + 1000))
    bad_sum = bytearray(cf.make_header(NS, b"hdrsum", b"z" * 1000).pack() + b"z" * 1000)
    bad_sum[200] ^= 0xFF  # inside the header: the header checksum no longer matches
    path(b"hdrsum").write_bytes(bad_sum)
    other = cf.make_header(NS, b"other", b"o" * 1000).pack() + b"o" * 1000
    path(b"renamed").write_bytes(other)  # a well-formed file of another key
    cut = cf.make_header(NS, b"cut", b"c" * 1000).pack() + b"c" * 10
    path(b"cut").write_bytes(cut)  # the header says 1000 payload bytes, the file holds 10
    corrupt = [b"empty", b"short", b"almost", b"garbage", b"hdrsum", b"renamed", b"cut"]
    return good, irregular, corrupt


def test_planted_non_chunk_files_are_never_present(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    root, outside = short_tmp / "long", short_tmp / "outside"
    good, irregular, corrupt = plant_bad_files(root, outside)
    before = tree_snapshot(outside)
    d = disk_daemon(start_daemon, root, env={"INFERA_KVD_TEST_LOAD_DELAY_S": "1"})
    with HealthProbe(d.socket) as probe, d.client(namespace=NS, timeout=5) as c:
        assert long_stats(c)["state"] == "loading"
        for key in irregular + corrupt:  # while loading, answered by looking at the file itself
            assert c.lookup([key]) == 0, f"{key!r} is not a chunk"
        assert c.lookup(list(good)) == 3
        s = wait_ready(c)
        for key in irregular + corrupt:
            assert c.lookup([key]) == 0, f"{key!r} is not a chunk"
            assert c.get(key) is None
        assert all(c.get(k) == v for k, v in good.items())
        s = long_stats(c)
        assert s["chunks"] == 3 and s["files_ignored"] == 5
        assert s["corrupt_chunks"] == 7 and s["quarantined"] == 7
        assert c.stats()["corrupt_chunks_total"] == 7
        assert c.adopt(irregular, [3000] * len(irregular))["adopted"] == 0, "ADOPT must not index them"
        assert c.lookup([irregular[0]]) == 0
        enough_rounds(probe)
    probe.assert_healthy()
    for key in irregular:  # left in place, never opened
        assert os.path.lexists(cf.chunk_path(str(root), NS, key))
    for key in corrupt:  # moved to the quarantine, as the read path does
        assert not os.path.lexists(cf.chunk_path(str(root), NS, key))
    assert len(list((root / "quarantine").iterdir())) == 7
    assert tree_snapshot(outside) == before

    d.stop()
    d.start()  # a clean restart adopts the index snapshot: still absent, nothing re-checked
    with d.client(namespace=NS, timeout=5) as c:
        s = wait_ready(c)
        assert s["index_source"] == "snapshot" and s["chunks"] == 3
        assert s["files_ignored"] == 0 and s["corrupt_chunks"] == 0 and s["quarantined"] == 7
        assert all(c.lookup([key]) == 0 for key in irregular + corrupt)
        assert all(c.get(k) == v for k, v in good.items())
    d.kill()
    d.start()  # after a crash checkpoint + journal, then the reconcile: links and such never listed
    with d.client(namespace=NS, timeout=5) as c:
        s = wait_ready(c)
        assert s["index_source"] == "snapshot+journal"
        s = wait_until(lambda: (x := long_stats(c))["reconcile"] == "finished" and x, 15, "reconcile")
        assert s["reconcile_added"] == 0 and s["reconcile_dropped"] == 0 and s["chunks"] == 3
        assert s["files_ignored"] == 0 and s["corrupt_chunks"] == 0 and s["quarantined"] == 7
        assert all(c.lookup([key]) == 0 for key in irregular + corrupt)
        assert all(c.get(k) == v for k, v in good.items())


# -- item 15: planted symlinks are never followed ------------------------------------------------
def test_planted_symlinks_are_never_followed(start_daemon: Callable[..., Daemon], short_tmp: Path) -> None:
    root, outside = short_tmp / "long", short_tmp / "outside"
    ns_dir = root / cf.VERSION_DIR / cf.ns_dirname(cf.ns_digest(NS))
    ns_dir.mkdir(parents=True)
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    (outside / "qdir").mkdir()
    (outside / "ns2").mkdir()
    (root / ".lock").symlink_to(outside / "lockfile")  # a dangling link: must not create it
    (root / "quarantine").symlink_to(outside / "qdir")  # corrupt files must not move there
    ns2 = "other-model|tp0"
    (root / cf.VERSION_DIR / cf.ns_dirname(cf.ns_digest(ns2))).symlink_to(outside / "ns2")
    bad = Path(cf.chunk_path(str(root), NS, b"corrupt"))
    bad.parent.mkdir(parents=True)
    bad.write_bytes(os.urandom(cf.HEADER_SIZE + 100))
    before = tree_snapshot(outside)

    d = disk_daemon(start_daemon, root)
    data = payloads(20)
    # the temporary names the writers used to pick: namespace.<pid>.<n>.tmp, .<file>.<pid>.<n>.tmp
    for n in range(1, 65):
        target = victim if n % 2 else outside / f"created-{n}"
        (ns_dir / f"namespace.{d.pid}.{n}{cf.TMP_SUFFIX}").symlink_to(target)
    for k in list(data)[:5]:
        fan = ns_dir / cf.fan_dirname(k)
        fan.mkdir(exist_ok=True)
        for n in range(1, 65):
            (fan / f".{cf.file_name(k)}.{d.pid}.{n}{cf.TMP_SUFFIX}").symlink_to(victim)
    with HealthProbe(d.socket) as probe:
        with d.client(namespace=NS) as c:
            wait_ready(c)
            for k, v in data.items():
                assert c.put(k, v)
            s = wait_until(
                lambda: (s := long_stats(c))["queued_writes"] == 0 and s["files_written"] >= 20 and s,
                15,
                "20 chunk files written",
            )
            assert s["corrupt_chunks"] == 1
        with d.client(namespace=ns2) as c2:
            for i in range(5):
                assert c2.put(f"ns2-{i}".encode(), b"n" * 5000)
            wait_until(lambda: long_stats(c2)["failed_writes"] >= 5, 15, "writes into a planted link refused")
            assert all(c2.get(f"ns2-{i}".encode()) == b"n" * 5000 for i in range(5)), "RAM keeps serving"
        enough_rounds(probe)
    probe.assert_healthy()
    assert d.stop() == 0
    assert tree_snapshot(outside) == before, "a file outside --long-path was created or written"
    assert victim.read_bytes() == b"precious"
    for k in data:
        p = Path(cf.chunk_path(str(root), NS, k))
        assert p.is_file() and not p.is_symlink()
    assert (root / cf.VERSION_DIR / cf.ns_dirname(cf.ns_digest(NS)) / cf.NAMESPACE_FILE).read_text() == NS
    d.start()
    read_back(d, data)
