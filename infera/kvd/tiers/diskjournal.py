"""The disk tier's index journal: the index changes since the checkpoint ``<root>/v1.index``.

The checkpoint (:mod:`.diskindex`) is the whole index at one moment; the journal
``<root>/v1.journal`` lists what changed since, so a start after a crash (kill -9) rebuilds the
index from the two in seconds instead of reading the header of every file. Both carry the same
random generation id; a journal of another generation is never replayed over a checkpoint.

The daemon appends records in frames, one ``write`` per loop iteration that changed the index,
without fsync: a killed process loses nothing the kernel took, a power loss may lose the journal's
tail or leave it short or stale. That is why a start that replays a journal always runs the
background reconcile (:mod:`.diskreconcile`): it lists the tree and fixes what the journal missed.
Every read still verifies the file, so an index entry the journal got wrong is a miss, never wrong
bytes.

Layout (little-endian). Header, 56 bytes: magic ``KVDJRNL\\x01``, version (u16), two pad fields
(u16, u32), the ``v1`` directory's device and inode (u64 each), the generation (16 bytes, the
checkpoint's), an XXH3-64 of those 48 bytes. Then frames: record bytes (u32), record count (u32),
the records, an XXH3-64 of the frame's 8-byte head and its records. A record: op (u8: 1 a file
landed, 2 a file removed), fkey length (u8), the fkey (namespace prefix + key), and for op 1 the
file's size (u64).

At start: a frame cut short at the end (a torn tail: the last write of a killed daemon, or a power
loss) is ignored and cut off; a complete frame whose checksum fails, a bad header, or another
generation or tree means the journal is not used and the tier scans every file.

During a checkpoint rewrite the records go to this journal and to ``<root>/.v1.journal.next``,
which holds the new generation; once the new checkpoint is in place the loop renames it over
``v1.journal``. A crash between the two renames leaves the new checkpoint and the ``next`` journal:
the start picks the journal whose generation matches.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from dataclasses import dataclass, field

from infera.kvd import chunkfile as cf

JOURNAL_FILE = "v1.journal"
NEXT_FILE = ".v1.journal.next"
MAGIC = b"KVDJRNL\x01"
VERSION = 1
LANDED, REMOVED = 1, 2
_HEAD = struct.Struct("<8sHHIQQ16s")  # magic, version, pad, pad, v1 dev, v1 ino, generation
_SUM = struct.Struct("<Q")
_FRAME = struct.Struct("<II")  # record bytes, records
_REC = struct.Struct("<BB")  # op, fkey length
_SIZE = struct.Struct("<Q")
HEADER_SIZE = _HEAD.size + _SUM.size
SLICE = 32768  # entries handled in one C call (the loop thread gets the GIL between them)
_OPEN = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC

Record = tuple[int, bytes, int]  # (op, fkey, size; 0 for REMOVED)


class BadJournal(Exception):
    """The journal cannot be used (its message says why): the tier scans every file instead."""


def _sum(data: bytes | memoryview) -> bytes:
    return _SUM.pack(cf.checksum(cf.ALGO_XXH3_64, data))


def header(v1_id: tuple[int, int], generation: bytes) -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, 0, 0, v1_id[0], v1_id[1], generation)
    return head + _sum(head)


def encode(op: int, fkey: bytes, size: int = 0) -> bytes:
    """One record (appended to a frame by :class:`Writer`)."""
    rec = _REC.pack(op, len(fkey)) + fkey
    return rec + _SIZE.pack(size) if op == LANDED else rec


def frame(records: bytes, count: int) -> bytes:
    head = _FRAME.pack(len(records), count)
    return head + records + _sum(head + records)


# -- reading (a start) ----------------------------------------------------------------------
@dataclass
class Replay:
    name: str  # the file it came from (JOURNAL_FILE or NEXT_FILE)
    records: list[Record] = field(default_factory=list)
    valid_len: int = 0  # bytes up to the end of the last whole frame
    torn: int = 0  # bytes after it (a torn tail), ignored


def parse(data: bytes, v1_id: tuple[int, int]) -> tuple[bytes, Replay]:
    """(generation, records) of a journal file's bytes; raises BadJournal."""
    if len(data) < HEADER_SIZE:
        raise BadJournal(f"torn header ({len(data)} bytes)")
    magic, version, _p, _q, dev, ino, generation = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise BadJournal("not a kvd index journal (bad magic)")
    if data[_HEAD.size : HEADER_SIZE] != _sum(data[: _HEAD.size]):
        raise BadJournal("header checksum mismatch")
    if version != VERSION:
        raise BadJournal(f"journal version {version} (this daemon reads {VERSION})")
    if (dev, ino) != v1_id:
        raise BadJournal("written for another directory (copied or recreated tree)")
    out = Replay("")
    off, view = HEADER_SIZE, memoryview(data)
    while off < len(data):
        if off + _FRAME.size > len(data):
            break
        nbytes, count = _FRAME.unpack_from(data, off)
        end = off + _FRAME.size + nbytes
        if end + _SUM.size > len(data):
            break  # cut short: a torn tail
        if view[end : end + _SUM.size] != _sum(view[off:end]):
            raise BadJournal(f"frame at byte {off} damaged (checksum mismatch)")
        out.records += _records(data, off + _FRAME.size, end, count)
        off = end + _SUM.size
    out.valid_len, out.torn = off, len(data) - off
    return generation, out


def _records(data: bytes, off: int, end: int, count: int) -> list[Record]:
    recs: list[Record] = []
    while off < end:
        op, klen = _REC.unpack_from(data, off)
        off += _REC.size
        fkey = data[off : off + klen]
        off += klen
        size = 0
        if op == LANDED:
            (size,) = _SIZE.unpack_from(data, off)
            off += _SIZE.size
        elif op != REMOVED:
            raise BadJournal(f"unknown record op {op}")
        recs.append((op, fkey, size))
    if off != end or len(recs) != count:
        raise BadJournal("frame records do not add up")
    return recs


def _read(root_fd: int, name: str) -> bytes | None:
    try:
        fd = cf.open_regular(name, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except cf.NotRegular as exc:
        raise BadJournal(str(exc)) from None
    try:
        chunks = []
        while block := os.read(fd, 1 << 24):
            chunks.append(block)
        return b"".join(chunks)
    finally:
        os.close(fd)


def find(root_fd: int, generation: bytes, v1_id: tuple[int, int]) -> Replay | None:
    """The journal of ``generation`` (``v1.journal``, or the ``next`` one a crash during a
    checkpoint rewrite left), or None when there is none at all (a clean stop); raises BadJournal
    for one that cannot be used. OSError passes through."""
    seen = []
    for name in (JOURNAL_FILE, NEXT_FILE):
        data = _read(root_fd, name)
        if data is None:
            continue
        try:
            gen, replay = parse(data, v1_id)
        except BadJournal as exc:
            seen.append(f"{name}: {exc}")
            continue
        if gen == generation:
            replay.name = name
            return replay
        seen.append(f"{name}: of another generation than the checkpoint")
    if seen:
        raise BadJournal("; ".join(seen))
    return None


def discard(root_fd: int) -> None:
    """Remove both journal files (durably: a later start must not find a stale one)."""
    for name in (JOURNAL_FILE, NEXT_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=root_fd)
    os.fsync(root_fd)


def create(root_fd: int, name: str, v1_id: tuple[int, int], generation: bytes) -> int:
    """A new journal file holding only its header (through a temporary name and a rename, so
    ``name`` never holds a torn header); returns a descriptor to append to."""
    cf.write_file_at(root_fd, name, header(v1_id, generation), b"", sync="none")
    return os.open(name, _OPEN, dir_fd=root_fd)


def reopen(root_fd: int, replay: Replay) -> int:
    """Continue the journal a start replayed: its torn tail cut off, under ``v1.journal``."""
    fd = os.open(replay.name, _OPEN, dir_fd=root_fd)
    try:
        os.ftruncate(fd, replay.valid_len)
        if replay.name != JOURNAL_FILE:
            os.rename(replay.name, JOURNAL_FILE, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(NEXT_FILE, dir_fd=root_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replay(entries: list[tuple[bytes, int]], records: list[Record]) -> list[tuple[bytes, int]]:
    """The checkpoint's entries (least recently used first) with the journal applied: a landed
    file becomes the most recent, a removed one leaves."""
    index: dict[bytes, int] = {}
    for at in range(0, len(entries), SLICE):  # slices: the loop thread gets the GIL between them
        index.update(entries[at : at + SLICE])
    for op, fkey, size in records:
        index.pop(fkey, None)
        if op == LANDED:
            index[fkey] = size
    out: list[tuple[bytes, int]] = []
    items = iter(index.items())
    while len(out) < len(index):
        out += itertools.islice(items, SLICE)
    return out


# -- writing (the loop) ---------------------------------------------------------------------
class Writer:
    """Records buffered on the loop and written as one frame by :meth:`flush` (no fsync). Until
    the start decides which journal to continue (``fd`` None) they are only buffered."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.next_fd: int | None = None  # the new generation's, during a checkpoint rewrite
        self.buf = bytearray()
        self.count = 0
        self.records = 0  # since the checkpoint: what the next start would replay
        self.broken = False

    def landed(self, fkey: bytes, size: int) -> None:
        if not self.broken:
            self.buf += encode(LANDED, fkey, size)
            self.count += 1

    def removed(self, fkey: bytes) -> None:
        if not self.broken:
            self.buf += encode(REMOVED, fkey)
            self.count += 1

    def flush(self) -> None:
        """Write the buffered records as one frame (OSError passes through)."""
        if self.fd is None or not self.count:
            return
        data = frame(bytes(self.buf), self.count)
        self.buf.clear()
        self.records += self.count
        self.count = 0
        for fd in (self.fd, self.next_fd):
            if fd is not None:
                _write_all(fd, data)

    def close(self) -> None:
        for fd in (self.fd, self.next_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.next_fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


__all__ = [
    "JOURNAL_FILE",
    "LANDED",
    "NEXT_FILE",
    "REMOVED",
    "BadJournal",
    "Replay",
    "Writer",
    "create",
    "discard",
    "find",
    "parse",
    "reopen",
    "replay",
]
