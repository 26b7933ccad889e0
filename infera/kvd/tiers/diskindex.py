"""The disk tier's index checkpoint ``<root>/v1.index``: the whole index at one moment.

A restart otherwise opens and reads the header of every chunk file (:func:`diskscan.scan`), which
is linear in the files and too slow at a million of them. The checkpoint is written (tmp + fsync +
rename + directory fsync) at a clean stop, after a start that had to scan, and by the running
daemon whenever its journal (:mod:`.diskjournal`, the changes since the checkpoint) grows past a
bound. It is never removed at start: its random generation id ties it to its journal.

At start (:func:`restore`), in this order:

* checkpoint + the journal of its generation (the daemon did not stop cleanly): the checkpoint with
  the journal replayed is the index (source ``snapshot+journal``), then a background reconcile
  lists the tree and fixes what the journal missed (:mod:`.diskreconcile`);
* checkpoint and no journal (a clean stop): which entries it may trust is decided per fan directory
  (``v1/<ns>/<fan>``): a clean stop records each one's inode, mtime and ctime, and a directory whose
  stamp differs now (a file created, renamed over or deleted since the stop) is scanned again the
  usual way; its entries are dropped (source ``snapshot``). A checkpoint written while the daemon
  ran records no stamps, so without its journal every directory is scanned again;
* anything else (no checkpoint, torn, another version, another tree, a journal that cannot be
  used): a full scan (source ``scan``; ``index_detail`` says why).

Adopting trusts the checkpoint for what the scan checks (the file is a regular chunk file of this
key and size); every read still verifies header and payload, so a file changed in place since
is a miss (and quarantined), never wrong bytes.

Layout (little-endian): a header (magic, version, entry count, fan count, the v1 directory's
device and inode, the time written, a random generation id), the fan table (namespace prefix, fan
byte, inode, mtime_ns, ctime_ns each), the entries in LRU order as runs of one key length (key
length, count, then per entry the fkey and the file size), and an XXH3-64 of all of it.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from infera.kvd import chunkfile as cf
from infera.kvd.keyspace import NS_PREFIX_LEN
from infera.kvd.tiers import diskjournal, diskscan

INDEX_FILE = "v1.index"
MAGIC = b"KVDINDX\x01"
VERSION = 1
_HEAD = struct.Struct("<8sHHQIQQQ16s")  # magic, version, pad, entries, fans, dev, ino, written_ns, generation
_FAN = struct.Struct(f"<{NS_PREFIX_LEN}sBQQQ")  # ns prefix, fan, inode, mtime_ns, ctime_ns
_RUN = struct.Struct("<BI")  # key length, entries in the run
_SUM = struct.Struct("<Q")
SLICE = 32768  # entries parsed in one go

Fan = tuple[bytes, int]  # (namespace prefix, fan byte)
Stamp = tuple[int, int, int]  # (inode, mtime_ns, ctime_ns)


@dataclass
class Snapshot:
    entries: list[tuple[bytes, int]]  # (fkey, file size), least recently used first
    fans: dict[Fan, Stamp]
    written_ns: int = 0
    generation: bytes = b""


@dataclass
class Loaded:
    """What the load thread found: the entries to index (oldest first), the counters of what was
    scanned, and which path it took, in words."""

    result: diskscan.ScanResult
    entries: list[tuple[bytes, int]] = field(default_factory=list)
    source: str = "scan"  # "snapshot", "snapshot+journal" or "scan"
    detail: str = ""  # why the snapshot was not used, or what of it was scanned again
    # the checkpoint the entries equal once ``replay`` (if any) is applied; None: write a new one
    generation: bytes | None = None
    replay: diskjournal.Replay | None = None  # the journal replayed (the daemon continues it)


def v1_id(root_fd: int) -> tuple[int, int]:
    st = os.stat(cf.VERSION_DIR, dir_fd=root_fd, follow_symlinks=False)
    return st.st_dev, st.st_ino


def fan_stamps(root_fd: int) -> dict[Fan, Stamp]:
    """(inode, mtime, ctime) of every fan directory under ``v1`` (links are never followed)."""
    out: dict[Fan, Stamp] = {}
    try:
        vfd = cf.open_dir_at(root_fd, [cf.VERSION_DIR])
    except OSError:
        return out
    try:
        for ns, ns8 in diskscan.namespace_dirs(vfd):
            try:
                nsfd = cf.open_dir_at(vfd, [ns])
            except OSError:
                continue
            try:
                with os.scandir(nsfd) as it:
                    for e in it:
                        fan = diskscan.fan_byte(e.name)
                        if fan >= 0 and e.is_dir(follow_symlinks=False):
                            st = e.stat(follow_symlinks=False)
                            out[ns8, fan] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            except OSError:
                continue
            finally:
                os.close(nsfd)
    finally:
        os.close(vfd)
    return out


# -- writing (a clean stop) -----------------------------------------------------------------
def pack(
    root_fd: int, index: Iterable[tuple[bytes, int]], count: int, fans: dict[Fan, Stamp], generation: bytes
) -> bytearray:
    """The snapshot file's bytes for ``index`` ((fkey, size) pairs, LRU first) and ``fans``. Built
    in blocks of ``SLICE`` entries, each one C call, so a thread writing a checkpoint never holds
    the interpreter lock long (one join of a million entries took 170 ms)."""
    dev, ino = v1_id(root_fd)
    blocks = [_HEAD.pack(MAGIC, VERSION, 0, count, len(fans), dev, ino, time.time_ns(), generation)]
    blocks += [_FAN.pack(ns8, fan, *stamp) for (ns8, fan), stamp in fans.items()]
    run: list[bytes] = []
    run_len = -1
    rec = struct.Struct("<Q")

    def end_run() -> None:
        blocks.append(_RUN.pack(run_len - NS_PREFIX_LEN, len(run) // 2))
        blocks.extend(b"".join(run[at : at + 2 * SLICE]) for at in range(0, len(run), 2 * SLICE))

    for fkey, size in index:
        if len(fkey) != run_len:
            if run:
                end_run()
            run, run_len = [], len(fkey)
        run += (fkey, rec.pack(size))
    if run:
        end_run()
    out = bytearray(sum(map(len, blocks)) + _SUM.size)
    at = 0
    for block in blocks:
        out[at : at + len(block)] = block
        at += len(block)
    _SUM.pack_into(out, at, cf.checksum(cf.ALGO_XXH3_64, memoryview(out)[:at]))
    return out


def write(
    root_fd: int, index: Iterable[tuple[bytes, int]], count: int, generation: bytes = b"", stamps: bool = True
) -> int:
    """Write the checkpoint of ``index`` atomically (tmp, fdatasync, rename, directory fsync);
    returns its size in bytes. ``stamps``: record the fan stamps, taken now (a clean stop, once
    nothing writes); a checkpoint written while the daemon runs records none."""
    fans = fan_stamps(root_fd) if stamps else {}
    data = pack(root_fd, index, count, fans, generation or os.urandom(16))
    cf.write_file_at(root_fd, INDEX_FILE, b"", data, sync="always")
    return len(data)


# -- reading (a start) ----------------------------------------------------------------------
class BadSnapshot(Exception):
    """The snapshot file cannot be used (its message says why); the tier scans instead."""


def unpack(data: bytes, v1_id: tuple[int, int]) -> Snapshot:
    """Parse and check a snapshot file (raises BadSnapshot)."""
    if len(data) < _HEAD.size + _SUM.size:
        raise BadSnapshot(f"torn ({len(data)} bytes)")
    body, (stored,) = memoryview(data)[: -_SUM.size], _SUM.unpack_from(data, len(data) - _SUM.size)
    magic, version, _pad, count, nfans, dev, ino, written, gen = _HEAD.unpack_from(body, 0)
    if magic != MAGIC:
        raise BadSnapshot("not a kvd index snapshot (bad magic)")
    if version != VERSION:
        raise BadSnapshot(f"index snapshot version {version} (this daemon reads {VERSION})")
    if cf.checksum(cf.ALGO_XXH3_64, body) != stored:
        raise BadSnapshot("checksum mismatch (torn or damaged)")
    if (dev, ino) != v1_id:
        raise BadSnapshot("written for another directory (copied or recreated tree)")
    off = _HEAD.size
    fans: dict[Fan, Stamp] = {}
    for ns8, fan, inode, mtime, ctime in _FAN.iter_unpack(body[off : off + nfans * _FAN.size]):
        fans[ns8, fan] = (inode, mtime, ctime)
    off += nfans * _FAN.size
    entries: list[tuple[bytes, int]] = []
    while off < len(body):
        klen, n = _RUN.unpack_from(body, off)
        off += _RUN.size
        rec = struct.Struct(f"<{NS_PREFIX_LEN + klen}sQ")
        end = off + n * rec.size
        if not 1 <= klen <= cf.MAX_KEY or end > len(body):
            raise BadSnapshot("entry run out of range")
        for at in range(off, end, SLICE * rec.size):  # slices: the loop thread gets the GIL between them
            entries += rec.iter_unpack(body[at : min(end, at + SLICE * rec.size)])
        off = end
    if len(entries) != count:
        raise BadSnapshot(f"{len(entries)} entries, the header says {count}")
    return Snapshot(entries, fans, written, gen)


def take(root_fd: int) -> tuple[Snapshot | None, str]:
    """Read the checkpoint at start (it stays: its journal continues it): (snapshot or None, why
    not). A leftover temporary file of an interrupted write is removed first, so only a start may
    call it: while the daemon runs, such a file may be a checkpoint rewrite in progress (anything
    else reads the checkpoint with :func:`read`)."""
    with os.scandir(root_fd) as it:
        temps = [
            e.name
            for e in it
            if e.name.startswith(
                (f".{INDEX_FILE}.", f".{diskjournal.JOURNAL_FILE}.", f".{diskjournal.NEXT_FILE}.")
            )
            and cf.is_temp_name(e.name)
        ]
    for name in temps:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=root_fd)
    return read(root_fd)


def read(root_fd: int) -> tuple[Snapshot | None, str]:
    """Read and check the checkpoint: (snapshot or None, why not)."""
    try:
        fd = cf.open_regular(INDEX_FILE, dir_fd=root_fd)
    except FileNotFoundError:
        return None, "no index snapshot (first start, or the last stop was not clean)"
    except (OSError, cf.NotRegular) as exc:
        return None, f"index snapshot unreadable: {exc}"
    try:
        chunks = []
        while block := os.read(fd, 1 << 24):
            chunks.append(block)
        data = b"".join(chunks)
    except OSError as exc:
        return None, f"index snapshot unreadable: {exc.strerror}"
    finally:
        os.close(fd)
    try:
        return unpack(data, v1_id(root_fd)), ""
    except (BadSnapshot, OSError, struct.error) as exc:
        return None, f"index snapshot not used: {exc}"


def roll(root_fd: int, journal_len: int, generation: bytes) -> int:
    """A checkpoint rewrite, from the files alone (no copy of the live index): the checkpoint
    with the first ``journal_len`` bytes of its journal replayed, written as ``generation``;
    returns its size. Raises OSError, or BadSnapshot when the pair does not fit together."""
    snap, why = read(root_fd)
    if snap is None:
        raise BadSnapshot(why)
    fd = cf.open_regular(diskjournal.JOURNAL_FILE, dir_fd=root_fd)
    try:
        data = os.pread(fd, journal_len, 0)
    finally:
        os.close(fd)
    try:
        gen, replay = diskjournal.parse(data, v1_id(root_fd))
    except diskjournal.BadJournal as exc:
        raise BadSnapshot(f"journal: {exc}") from None
    if gen != snap.generation or replay.torn or len(data) != journal_len:
        raise BadSnapshot("the journal does not continue the checkpoint")
    entries = diskjournal.replay(snap.entries, replay.records)
    try:
        return write(root_fd, entries, len(entries), generation, stamps=False)
    finally:  # freed a slice at a time: one free of a million tuples holds the lock ~40 ms
        for lst in (entries, snap.entries, replay.records):
            while lst:
                del lst[-SLICE:]


def _fan_of(fkey: bytes) -> Fan:
    """The fan directory a chunk's file lives in (the rule of :func:`chunkfile.fan_dirname`)."""
    return fkey[:NS_PREFIX_LEN], diskscan.fan_byte(cf.fan_dirname(fkey[NS_PREFIX_LEN:]))


def _scan(root: str, why: str) -> Loaded:
    result = diskscan.scan_safely(root)
    return Loaded(result, [(fk, size) for _m, fk, size in result.entries], "scan", why)


def restore(root: str, root_fd: int) -> Loaded:
    """The index at start (the module docstring says which way and why). Never raises."""
    try:
        snap, why = take(root_fd)
        if snap is None:
            return _scan(root, why)
        replay = diskjournal.find(root_fd, snap.generation, v1_id(root_fd))
    except OSError as exc:
        return _scan(root, f"index checkpoint or journal unreadable: {exc.strerror or exc}")
    except (diskjournal.BadJournal, struct.error) as exc:
        return _scan(root, f"index journal not used: {exc}")
    if replay is not None:  # the daemon did not stop cleanly: checkpoint + journal
        entries = diskjournal.replay(snap.entries, replay.records)
        detail = f"checkpoint of {len(snap.entries)} chunks + {len(replay.records)} journal records"
        if replay.torn:
            detail += f"; a torn journal tail of {replay.torn} bytes ignored"
        result = diskscan.scan_safely(root, only=set())  # the quarantine and other versions only
        return Loaded(result, entries, "snapshot+journal", detail, snap.generation, replay)
    now = fan_stamps(root_fd)
    stale = {f for f, stamp in now.items() if snap.fans.get(f) != stamp}
    drop = stale | (snap.fans.keys() - now.keys())  # changed, or gone since the snapshot
    entries = snap.entries
    if drop:
        entries = [e for e in entries if _fan_of(e[0]) not in drop]
    result = diskscan.scan_safely(root, only=stale)
    entries += [(fk, size) for _m, fk, size in result.entries]
    detail = f"{len(stale)} of {len(now)} fan directories changed since and scanned again"
    if not snap.fans and now:
        detail += " (a checkpoint written while the daemon ran, without its journal)"
    return Loaded(result, entries, "snapshot", detail, None if drop else snap.generation)


__all__ = [
    "INDEX_FILE",
    "BadSnapshot",
    "Loaded",
    "Snapshot",
    "fan_stamps",
    "restore",
    "take",
    "v1_id",
    "write",
]
