"""The chunk file format on its own: naming, header validation, checksums, atomic writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from infera.kvd import chunkfile as cf
from infera.kvd.keyspace import Namespace
from infera.kvd.tiers import diskfs, diskscan


def test_roundtrip_and_path_is_derived_from_namespace_and_key(tmp_path: Path) -> None:
    payload = os.urandom(10_000)
    path = cf.write_chunk(str(tmp_path), "model-a|tp0", b"\x01\x02key", payload)
    assert path == cf.chunk_path(str(tmp_path), "model-a|tp0", b"\x01\x02key")
    rel = os.path.relpath(path, tmp_path).split(os.sep)
    assert rel[0] == "v1" and len(rel[1]) == 16 and len(rel[2]) == 2 and rel[3] == "01026b6579.kvcache"
    assert os.path.getsize(path) == cf.HEADER_SIZE + len(payload)
    header, data = cf.read_chunk(path, digest=cf.ns_digest("model-a|tp0"), key=b"\x01\x02key")
    assert data == payload
    assert header.namespace == "model-a|tp0" and header.algo == cf.ALGO_XXH3_64
    assert (tmp_path / "v1" / rel[1] / "namespace").read_text() == "model-a|tp0"
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")], "temp file left behind"


def test_payload_starts_at_4096_for_direct_io(tmp_path: Path) -> None:
    payload = b"P" * 5000
    path = cf.write_chunk(str(tmp_path), "", b"k", payload)
    with open(path, "rb") as fh:
        fh.seek(4096)
        assert fh.read() == payload


def test_crc32_files_are_readable(tmp_path: Path) -> None:
    path = cf.write_chunk(str(tmp_path), "ns", b"k", b"abc" * 100, algo=cf.ALGO_CRC32)
    header, data = cf.read_chunk(path)
    assert header.algo == cf.ALGO_CRC32 and data == b"abc" * 100


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("offset", [0, 20, 100, 3000, 4096, 4096 + 999])
def test_any_flipped_byte_is_detected(tmp_path: Path, offset: int) -> None:
    path = cf.write_chunk(str(tmp_path), "ns", b"k", os.urandom(1000))
    _flip(path, offset)
    with pytest.raises(cf.CorruptChunk):
        cf.read_chunk(path)


@pytest.mark.parametrize("size", [0, 100, 4096, 4096 + 500])
def test_truncated_file_is_corrupt(tmp_path: Path, size: int) -> None:
    path = cf.write_chunk(str(tmp_path), "ns", b"k", os.urandom(1000))
    os.truncate(path, size)
    buf = memoryview(bytearray(1000))
    with pytest.raises(cf.CorruptChunk, match="truncated"):
        cf.read_into(path, buf)


def test_wrong_key_or_namespace_is_corrupt(tmp_path: Path) -> None:
    path = cf.write_chunk(str(tmp_path), "ns", b"k", b"x" * 10)
    with pytest.raises(cf.CorruptChunk, match="another key"):
        cf.read_chunk(path, key=b"other")
    with pytest.raises(cf.CorruptChunk, match="another namespace"):
        cf.read_chunk(path, digest=cf.ns_digest("other"))


def test_other_version_and_unknown_algorithm_are_not_corrupt(tmp_path: Path) -> None:
    header = cf.make_header("ns", b"k", b"data")
    header.version = 2
    with pytest.raises(cf.OtherVersion):
        cf.ChunkHeader.unpack(header.pack())
    header = cf.make_header("ns", b"k", b"data")
    raw = bytearray(header.pack())
    raw[12] = 99  # checksum algorithm id
    with pytest.raises(cf.OtherVersion, match="algorithm"):
        cf.ChunkHeader.unpack(raw)
    assert not cf.OtherVersion.corrupt and cf.CorruptChunk.corrupt


def test_long_namespace_is_truncated_in_text_but_not_in_digest() -> None:
    ns = "é" * 3000  # 6000 bytes of UTF-8
    header = cf.ChunkHeader.unpack(cf.make_header(ns, b"k", b"").pack())
    assert header.flags & cf.FLAG_NS_TRUNCATED
    assert ns.startswith(header.namespace) and header.namespace_digest == cf.ns_digest(ns)


def test_write_that_hits_enospc_leaves_no_file(small_fs: Path) -> None:
    root = str(small_fs)
    with pytest.raises(OSError) as err:
        cf.write_chunk(root, "ns", b"big", b"x" * (3 << 20))
    assert err.value.errno == errno.ENOSPC
    leftovers = [f for _d, _s, files in os.walk(root) for f in files if f != "namespace"]
    assert leftovers == []


def test_scan_indexes_names_sizes_and_sweeps_stale_temps(tmp_path: Path) -> None:
    root = str(tmp_path)
    p1 = cf.write_chunk(root, "a", b"k1", b"1" * 10, sync="none")
    p2 = cf.write_chunk(root, "b", b"k2", b"2" * 20, sync="none")
    os.utime(p1, (1000, 1000))
    d = os.path.dirname(p2)
    stale = os.path.join(d, ".k.kvcache.1.1.tmp")
    young = os.path.join(d, ".k.kvcache.1.2.tmp")
    for t in (stale, young):
        Path(t).write_bytes(b"partial")
    os.utime(stale, (1000, 1000))
    other = tmp_path / "v2" / "00" / "x.kvcache"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"future")
    result = diskscan.scan(root)
    fkeys = [(e[1], e[2]) for e in result.entries]
    assert fkeys == [
        (Namespace(0, "a", cf.ns_digest("a")).fkey(b"k1"), 4096 + 10),
        (Namespace(1, "b", cf.ns_digest("b")).fkey(b"k2"), 4096 + 20),
    ], "entries must be ordered oldest first"
    assert result.other_version == 1 and result.stale_temps == 1 and result.young_temps == [young]
    assert not os.path.exists(stale) and os.path.exists(young)
    assert diskfs.file_path(root, fkeys[1][0]) == p2
