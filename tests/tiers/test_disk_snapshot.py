"""The disk tier's index snapshot, against real daemon processes: a clean stop writes it, the next
start adopts it (it stays, as the checkpoint of the journal the daemon starts); a damaged file or a
tree changed since falls back to the scan (wholly or per fan directory); whatever the snapshot
says, no wrong byte is ever served. Crashes and the journal: test_disk_journal.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile import HealthProbe, enough_rounds
from test_disk_tier import NS, disk_daemon, long_stats, on_disk, wait_ready, wait_written

from helpers import Daemon
from infera.kvd import chunkfile as cf
from infera.kvd.client import KvdClient
from infera.kvd.process import wait_until
from infera.kvd.tiers import diskindex, diskjournal

SIZE = 96 << 10


@pytest.fixture
def root(short_tmp: Path) -> Path:
    """The daemon's --long-path (the daemon creates it)."""
    return short_tmp / "long"


def snapshot_file(root: Path) -> Path:
    return root / diskindex.INDEX_FILE


def journal_file(root: Path) -> Path:
    return root / diskjournal.JOURNAL_FILE


def checkpoint_generation(root: Path) -> bytes:
    """The generation of the checkpoint in place. Only reads: ``diskindex.take`` (the start's)
    also removes temporary files, and would unlink the one a running daemon's checkpoint rewrite
    is writing (its rename then fails with ENOENT and the rewrite waits a minute to retry)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        snap, why = diskindex.read(fd)
    finally:
        os.close(fd)
    assert snap is not None, why
    return snap.generation


def journal_started(root: Path) -> bytes:
    """Wait for the journal the daemon starts after its index loaded; its generation, which is
    the checkpoint's."""
    wait_until(journal_file(root).is_file, 10, "the index journal")
    gen = checkpoint_generation(root)
    v1 = (root / "v1").stat()
    jgen, _replay = diskjournal.parse(journal_file(root).read_bytes(), (v1.st_dev, v1.st_ino))
    assert jgen == gen, "the journal continues the checkpoint"
    return gen


def restarted(d: Daemon) -> KvdClient:
    """Start the (stopped or killed) daemon again; a client, once its index is loaded."""
    d.start()
    c = d.client(namespace=NS, timeout=10)
    wait_ready(c)
    return c


def stopped_cleanly(
    start_daemon: Callable[..., Daemon], root: Path, n: int
) -> tuple[Daemon, dict[bytes, bytes]]:
    """A disk daemon that wrote ``n`` chunks (the data returned) and stopped cleanly: it left a
    snapshot."""
    d = disk_daemon(start_daemon, root)
    data = on_disk(d, n, SIZE)
    d.stop()
    assert snapshot_file(root).is_file(), "a clean stop must leave an index snapshot"
    return d, data


def all_served(c: KvdClient, data: dict[bytes, bytes]) -> None:
    for k, v in data.items():
        assert c.get(k) == v, f"{k!r} must come back exactly"


def test_clean_restart_adopts_the_snapshot_and_serves_exact_bytes(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d = disk_daemon(start_daemon, root)
    data = on_disk(d, 10, SIZE)
    with d.client(namespace=NS) as c:
        assert long_stats(c)["index_source"] == "scan"  # the first start had nothing to adopt
    d.stop()
    assert snapshot_file(root).is_file(), "a clean stop must leave an index snapshot"
    assert "index snapshot of 10 chunks written" in d.log()
    with restarted(d) as c:
        s = long_stats(c)
        assert s["index_source"] == "snapshot" and s["chunks"] == 10
        assert s["bytes_used"] == 10 * (cf.HEADER_SIZE + SIZE)
        assert "0 of" in s["index_detail"], s["index_detail"]  # no fan directory scanned again
        journal_started(root)  # the adopted snapshot stays: it is the journal's checkpoint
        all_served(c, data)
        s = long_stats(c)
        assert s["hits"] == 10 and s["corrupt_chunks"] == 0
    assert "index adopted from snapshot, 10 chunks" in d.log()
    stat = subprocess.run(
        [sys.executable, "-m", "infera.kvd.statctl", "--socket", d.socket],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert stat.returncode == 0 and "(snapshot)" in stat.stdout, stat.stdout + stat.stderr


def test_kill_9_after_an_adopted_snapshot_replays_the_journal(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d, data = stopped_cleanly(start_daemon, root, 6)
    with restarted(d) as c:
        assert long_stats(c)["index_source"] == "snapshot"
        c.delete([b"key-0"])  # changes the adopted snapshot does not know about
        data.pop(b"key-0")
        data[b"late"] = os.urandom(SIZE)
        assert c.put(b"late", data[b"late"])
        wait_written(c, 6)
    d.kill()
    with restarted(d) as c:
        s = long_stats(c)
        assert s["index_source"] == "snapshot+journal", s["index_detail"]
        assert "6 chunks + 2 journal records" in s["index_detail"], s["index_detail"]
        assert c.lookup([b"key-0"]) == 0
        all_served(c, data)
    assert d.log().count(": scanned ") == 1, "only the first start scans"
    assert "index adopted from snapshot+journal" in d.log()


def _damage(root: Path, how: str) -> None:
    path = snapshot_file(root)
    raw = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "flipped":
        raw[len(raw) // 2] ^= 0x40
        path.write_bytes(raw)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "version":  # a well-formed file of a future version (checksum recomputed)
        raw[8] += 1
        body = bytes(raw[:-8])
        path.write_bytes(body + cf.checksum(cf.ALGO_XXH3_64, body).to_bytes(8, "little"))
    elif how == "link":  # a symbolic link planted in its place: never followed
        target = root.parent / "elsewhere.index"
        target.write_bytes(raw)
        path.unlink()
        path.symlink_to(target)


@pytest.mark.parametrize("how", ["truncated", "flipped", "empty", "version", "link"])
def test_damaged_snapshot_falls_back_to_the_scan(
    start_daemon: Callable[..., Daemon], root: Path, how: str
) -> None:
    d, data = stopped_cleanly(start_daemon, root, 8)
    _damage(root, how)
    d.start()
    with HealthProbe(d.socket) as probe, d.client(namespace=NS, timeout=10) as c:
        s = wait_ready(c)
        assert s["index_source"] == "scan", s["index_detail"]
        assert "snapshot" in s["index_detail"] and s["chunks"] == 8
        all_served(c, data)
        enough_rounds(probe)
    probe.assert_healthy()
    journal_started(root)  # the damaged file was replaced by a checkpoint of the scan
    assert not snapshot_file(root).is_symlink()
    assert (root.parent / "elsewhere.index").exists() or how != "link", "a link must not be followed"


def test_files_changed_after_the_snapshot_are_scanned_again(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d, data = stopped_cleanly(start_daemon, root, 12)
    os.unlink(cf.chunk_path(str(root), NS, b"key-1"))  # deleted
    data.pop(b"key-1")
    data[b"key-2"] = os.urandom(SIZE // 2)  # rewritten with other bytes and another length
    cf.write_chunk(str(root), NS, b"key-2", data[b"key-2"], sync="none")
    data[b"new"] = os.urandom(SIZE)  # added
    cf.write_chunk(str(root), NS, b"new", data[b"new"], sync="none")
    with restarted(d) as c, HealthProbe(d.socket) as probe:
        s = long_stats(c)
        assert s["index_source"] == "snapshot" and s["chunks"] == 12
        assert not s["index_detail"].startswith("0 of"), s["index_detail"]
        assert c.lookup([b"key-1"]) == 0 and c.get(b"key-1") is None
        all_served(c, data)
        s = long_stats(c)
        assert s["corrupt_chunks"] == 0 and s["bytes_used"] == sum(
            cf.HEADER_SIZE + len(v) for v in data.values()
        )
        enough_rounds(probe)
    probe.assert_healthy()


def test_file_damaged_in_place_after_the_snapshot_is_a_counted_miss(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d, data = stopped_cleanly(start_daemon, root, 6)
    flipped = Path(cf.chunk_path(str(root), NS, b"key-3"))  # in place: its directory does not change
    with open(flipped, "r+b") as f:
        f.seek(cf.HEADER_SIZE + 777)
        byte = f.read(1)
        f.seek(cf.HEADER_SIZE + 777)
        f.write(bytes([byte[0] ^ 1]))
    os.truncate(cf.chunk_path(str(root), NS, b"key-4"), cf.HEADER_SIZE + 100)
    with restarted(d) as c:
        s = long_stats(c)
        assert s["index_source"] == "snapshot" and s["chunks"] == 6  # the snapshot trusted them
        assert c.get(b"key-3") is None and c.get(b"key-4") is None
        for k in (b"key-0", b"key-1", b"key-2", b"key-5"):
            assert c.get(k) == data[k]
        s = long_stats(c)
        assert s["corrupt_chunks"] == 2 and s["chunks"] == 4
        assert c.lookup([b"key-3"]) == 0 and c.lookup([b"key-4"]) == 0, "dropped from the index"
    assert not flipped.exists()


def test_snapshot_listing_a_missing_or_misdescribed_file_never_serves_wrong_bytes(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d, data = stopped_cleanly(start_daemon, root, 4)
    # a snapshot whose fan stamps match the tree but whose entries lie: a key with no file in an
    # existing fan directory, and a real file recorded with another size
    ns8 = cf.ns_digest(NS)[:8]
    real = ns8 + b"key-0"
    fan = cf.fan_dirname(b"key-0")
    ghost = next(k for i in range(10_000) if cf.fan_dirname(k := f"ghost-{i}".encode()) == fan)
    lies = [(ns8 + ghost, cf.HEADER_SIZE + SIZE), (real, cf.HEADER_SIZE + 2 * SIZE)]
    honest = [(ns8 + k, cf.HEADER_SIZE + SIZE) for k in data if k != b"key-0"]
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        snapshot_file(root).unlink()
        diskindex.write(fd, [*honest, *lies], len(honest) + len(lies))
    finally:
        os.close(fd)
    with restarted(d) as c, HealthProbe(d.socket) as probe:
        s = long_stats(c)
        assert s["index_source"] == "snapshot" and s["chunks"] == 5 and "0 of" in s["index_detail"]
        misses = s["misses"]
        assert c.get(ghost) is None
        assert c.lookup([ghost]) == 0, "a listed file that is missing must leave the index"
        assert long_stats(c)["misses"] == misses + 1, "and be a counted miss"
        assert c.get(b"key-0") is None, "a size that does not match the file is a miss"
        assert c.get(b"key-0") == data[b"key-0"], "then the real size is taken from the file"
        all_served(c, data)
        enough_rounds(probe)
    probe.assert_healthy()
