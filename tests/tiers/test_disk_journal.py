"""The disk tier's index journal, against real daemon processes and real files: after kill -9 the
index is the checkpoint with the journal replayed (no scan), the background reconcile fixes what
the journal missed, a damaged or foreign journal falls back safely, a checkpoint rewrite can be
killed at any point; whatever happens, no wrong byte is ever served."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import HealthProbe, enough_rounds
from test_disk_snapshot import all_served, checkpoint_generation, journal_file, restarted
from test_disk_tier import NS, disk_daemon, long_stats, wait_ready, wait_written

from helpers import Daemon
from infera.bench.disk import plant_chunk_files
from infera.kvd import chunkfile as cf
from infera.kvd.client import KvdClient
from infera.kvd.process import wait_until
from infera.kvd.tiers import diskjournal

SIZE = 32 << 10


@pytest.fixture
def root(short_tmp: Path) -> Path:
    return short_tmp / "long"


def reconciled(c: KvdClient) -> dict[str, Any]:
    return wait_until(lambda: (s := long_stats(c))["reconcile"] == "finished" and s, 30, "reconcile")


def crashed(
    start_daemon: Callable[..., Daemon], root: Path, n: int, **env: str
) -> tuple[Daemon, dict[bytes, bytes]]:
    """A disk daemon (its first start: a scan of nothing, then a checkpoint and a journal) that
    wrote ``n`` long chunks in two batches (two journal frames), then was killed with -9."""
    d = disk_daemon(start_daemon, root, env=dict(env) or None)
    with d.client(namespace=NS, timeout=10) as c:
        wait_ready(c)
        wait_until(journal_file(root).is_file, 10, "the index journal")
        data = put_long(c, n // 2)
        wait_written(c, n // 2)
        data.update(put_long(c, n - n // 2, "more"))
        wait_written(c, n)
    d.kill()
    return d, data


def put_long(c: KvdClient, n: int, prefix: str = "key") -> dict[bytes, bytes]:
    data = {f"{prefix}-{i}".encode(): os.urandom(SIZE) for i in range(n)}
    for k, v in data.items():
        assert c.put(k, v, retention="long")
    return data


def test_kill_9_restart_replays_checkpoint_and_journal_without_a_scan(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d, data = crashed(start_daemon, root, 20)
    with restarted(d) as c:
        s = long_stats(c)
        assert s["index_source"] == "snapshot+journal", s["index_detail"]
        assert s["index_detail"] == "checkpoint of 0 chunks + 20 journal records", s["index_detail"]
        assert s["chunks"] == 20 and s["bytes_used"] == 20 * (cf.HEADER_SIZE + SIZE)
        all_served(c, data)
        s = reconciled(c)
        assert (s["reconcile_added"], s["reconcile_dropped"]) == (0, 0), "the journal was complete"
        assert s["hits"] == 20 and s["corrupt_chunks"] == 0
        stat = subprocess.run(
            [sys.executable, "-m", "infera.kvd.statctl", "--socket", d.socket],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "(snapshot+journal), reconcile finished in" in stat.stdout, stat.stdout + stat.stderr
    log = d.log()
    assert log.count(": scanned ") == 1, "only the first start (an empty tree) scans"
    assert "reconcile finished" in log and "0 indexed that the journal missed, 0 entries dropped" in log


def test_reconcile_indexes_a_planted_file_and_drops_a_deleted_one(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    d, data = crashed(start_daemon, root, 10)
    os.unlink(cf.chunk_path(str(root), NS, b"key-3"))  # behind the daemon's back, while it is down
    gone = data.pop(b"key-3")
    planted = os.urandom(SIZE)  # a file that landed but was never journaled
    cf.write_chunk(str(root), NS, b"planted", planted, sync="none")
    data[b"planted"] = planted
    with restarted(d) as c:
        assert long_stats(c)["index_source"] == "snapshot+journal"
        s = reconciled(c)
        assert (s["reconcile_added"], s["reconcile_dropped"]) == (1, 1)
        assert s["chunks"] == 10
        misses = s["misses"]
        assert c.get(b"key-3") is None, "a deleted file is a miss"
        assert long_stats(c)["misses"] == misses + 1, "a counted one"
        assert c.lookup([b"key-3"]) == 0 and c.lookup([b"planted"]) == 1
        all_served(c, data)
        assert gone not in (c.get(k) for k in data)
    assert "1 indexed that the journal missed, 1 entries dropped whose files are gone" in d.log()


def _rewrite_header(path: Path, generation: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[32:48] = generation
    raw[48:56] = struct.pack("<Q", cf.checksum(cf.ALGO_XXH3_64, bytes(raw[:48])))
    path.write_bytes(raw)


@pytest.mark.parametrize("how", ["torn", "flipped", "generation", "garbage", "link"])
def test_damaged_journal_falls_back_safely(start_daemon: Callable[..., Daemon], root: Path, how: str) -> None:
    d, data = crashed(start_daemon, root, 12)
    path = journal_file(root)
    raw = path.read_bytes()
    whole = 0
    if how == "torn":  # truncated in the middle of the last frame's records
        path.write_bytes(raw[:-13])
        v1 = (root / "v1").stat()
        whole = len(diskjournal.parse(raw[:-13], (v1.st_dev, v1.st_ino))[1].records)
        assert 0 < whole < 12
    elif how == "flipped":  # one bit in the first frame's records
        flipped = bytearray(raw)
        flipped[diskjournal.HEADER_SIZE + 20] ^= 0x10
        path.write_bytes(flipped)
    elif how == "generation":  # a well-formed journal of another checkpoint
        _rewrite_header(path, os.urandom(16))
    elif how == "link":  # a symbolic link planted in its place (to a well-formed copy): never followed
        target = root.parent / "elsewhere.journal"
        target.write_bytes(raw)
        path.unlink()
        path.symlink_to(target)
    else:
        path.write_bytes(os.urandom(len(raw)))
    d.start()
    with HealthProbe(d.socket) as probe, d.client(namespace=NS, timeout=10) as c:
        s = wait_ready(c)
        if how == "torn":  # the whole frames are replayed, the torn one left to the reconcile
            assert s["index_source"] == "snapshot+journal", s["index_detail"]
            assert f"+ {whole} journal records" in s["index_detail"], s["index_detail"]
            assert "torn journal tail" in s["index_detail"]
            s = reconciled(c)
            assert s["reconcile_added"] == 12 - whole and s["reconcile_dropped"] == 0
        else:
            assert s["index_source"] == "scan", s["index_detail"]
            assert "journal not used" in s["index_detail"], s["index_detail"]
            expect = {
                "generation": "another generation",
                "flipped": "damaged",
                "garbage": "magic",
                "link": "not a regular file",
            }[how]
            assert expect in s["index_detail"], s["index_detail"]
        assert long_stats(c)["chunks"] == 12
        all_served(c, data)
        enough_rounds(probe)
    probe.assert_healthy()
    assert d.log().count("journal not used") == (how != "torn")
    if how == "link":
        assert (root.parent / "elsewhere.journal").read_bytes() == raw, "a link is never followed"


def test_replay_and_reconcile_of_a_large_tree_keep_a_healthy_client_served(
    start_daemon: Callable[..., Daemon], root: Path
) -> None:
    plant_chunk_files(str(root), NS, 20_000, b"p" * 64)  # indexed by the first start's scan
    d = disk_daemon(start_daemon, root, "64M", "1G")
    with d.client(namespace=NS, timeout=10) as c:
        wait_ready(c)
        wait_until(journal_file(root).is_file, 30, "the index journal")
        data = put_long(c, 20)
        wait_written(c, 20_020)
    d.kill()
    plant_chunk_files(str(root), NS, 10_000, b"q" * 64, start=20_000)  # never journaled
    d.start()
    with HealthProbe(d.socket) as probe, d.client(namespace=NS, timeout=10) as c:
        s = wait_ready(c)
        assert s["index_source"] == "snapshot+journal", s["index_detail"]
        s = reconciled(c)
        assert probe.latencies, "the healthy client was served while the reconcile ran"
        assert s["reconcile_added"] == 10_000 and s["chunks"] == 30_020
        all_served(c, data)
        assert c.get((29_999).to_bytes(16, "big")) == b"q" * 64
        enough_rounds(probe)
    probe.assert_healthy()


def test_checkpoint_rewrite_switches_journals(start_daemon: Callable[..., Daemon], root: Path) -> None:
    d, data = crashed(start_daemon, root, 24, INFERA_KVD_TEST_CHECKPOINT_RECORDS="8")
    assert "index checkpoint written" in d.log() and "journal restarted" in d.log()
    d.env = None
    with restarted(d) as c:
        s = long_stats(c)
        assert s["index_source"] == "snapshot+journal"
        assert not s["index_detail"].startswith("checkpoint of 0 chunks"), s["index_detail"]
        all_served(c, data)
        s = reconciled(c)
        assert (s["reconcile_added"], s["reconcile_dropped"]) == (0, 0)


@pytest.mark.parametrize("when", ["before_rename", "between_renames"])
def test_kill_9_during_a_checkpoint_rewrite_leaves_a_restartable_tree(
    start_daemon: Callable[..., Daemon], root: Path, when: str
) -> None:
    env = {"INFERA_KVD_TEST_CHECKPOINT_RECORDS": "8", "INFERA_KVD_TEST_CHECKPOINT_DELAY_S": "5"}
    d = disk_daemon(start_daemon, root, env=env)
    nxt = root / diskjournal.NEXT_FILE
    with d.client(namespace=NS, timeout=10) as c:
        wait_ready(c)
        wait_until(journal_file(root).is_file, 10, "the index journal")
        old = checkpoint_generation(root)
        data = put_long(c, 12)  # past 8 records: a rewrite starts
        wait_written(c, 12)
        wait_until(nxt.is_file, 10, "the next journal")
        data.update(put_long(c, 4, "late"))  # their records go to both journals
        wait_written(c, 16)
        if when == "between_renames":  # the new checkpoint is in place, the journal not yet
            wait_until(lambda: checkpoint_generation(root) != old, 15, "the new checkpoint")
        assert nxt.is_file()
    d.kill()
    d.env = None
    with restarted(d) as c:
        s = long_stats(c)
        assert s["index_source"] == "snapshot+journal", s["index_detail"]
        assert s["chunks"] == 16
        all_served(c, data)
        s = reconciled(c)
        assert (s["reconcile_added"], s["reconcile_dropped"]) == (0, 0), "both journals were complete"
    assert not nxt.exists(), "the start settles on one journal"
