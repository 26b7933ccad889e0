"""Chunk-file format constants, its errors and the payload checksums (docs/chunk-format.md)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

try:  # xxhash is a base dependency; the fallback only keeps a broken install readable
    import xxhash

    _xxh3_64: Callable[[Any], int] | None = xxhash.xxh3_64_intdigest
except ImportError:  # pragma: no cover - exercised only without the wheel
    _xxh3_64 = None

MAGIC = b"KVDCHUNK"
FORMAT_VERSION = 1
HEADER_SIZE = 4096
EXT = ".kvcache"
VERSION_DIR = f"v{FORMAT_VERSION}"
NAMESPACE_FILE = "namespace"
NS_PREFIX_LEN = 8  # bytes of the namespace digest that name its directory (infera.kvd.keyspace)
QUARANTINE_DIR = "quarantine"
TMP_SUFFIX = ".tmp"

# Checksum algorithm ids. 0 is never valid; ids are never reused for another algorithm.
ALGO_XXH3_64 = 1  # xxHash XXH3, 64-bit, seed 0 (default: ~20 GB/s on one core)
ALGO_CRC32 = 2  # zlib CRC-32 (ISO-HDLC); needs nothing outside the standard library
ALGO_WSUM31 = 3  # position-weighted sums of 16-bit words mod 2^31-1: computable on a GPU
ALGO_NAMES = {ALGO_XXH3_64: "xxh3-64", ALGO_CRC32: "crc32", ALGO_WSUM31: "wsum31"}
WSUM_MOD = (1 << 31) - 1
WSUM_PIECE = 1 << 17  # 16-bit words per piece: (i + 1) * h_i summed over a piece stays < 2^63

MAX_KEY = 64

Buffer = bytes | bytearray | memoryview


class ChunkFileError(Exception):
    """A chunk file that cannot be used. ``corrupt`` says whether it should be quarantined."""

    corrupt = True


class CorruptChunk(ChunkFileError):
    """Truncated, checksum mismatch, wrong key: the bytes cannot be trusted."""


class OtherVersion(ChunkFileError):
    """A well-formed file of another format version or checksum algorithm: leave it alone."""

    corrupt = False


class NotRegular(ChunkFileError):
    """A symbolic link, directory, FIFO or device under a chunk name: never opened or trusted."""

    corrupt = False


class SizeChanged(ChunkFileError):
    """The file is not the size the caller expected (rewritten meanwhile): not corrupt."""

    corrupt = False

    def __init__(self, size: int) -> None:
        super().__init__(f"file is now {size} bytes")
        self.size = size


def default_algo() -> int:
    return ALGO_XXH3_64 if _xxh3_64 is not None else ALGO_CRC32


def checksum(algo: int, data: Buffer) -> int:
    """The payload checksum of ``data`` under algorithm ``algo`` (raises OtherVersion if unknown)."""
    if algo == ALGO_XXH3_64 and _xxh3_64 is not None:
        return _xxh3_64(data)
    if algo == ALGO_CRC32:
        return zlib.crc32(data)
    if algo == ALGO_WSUM31:
        return wsum31(data)
    raise OtherVersion(f"unknown checksum algorithm id {algo}")


def wsum_combine(s1: int, s2: int) -> int:
    return (s1 % WSUM_MOD) << 32 | (s2 % WSUM_MOD)


def wsum31(data: Buffer) -> int:
    """Checksum id 3 (docs/chunk-format.md): the payload as little-endian 16-bit words ``h_i``
    (a zero byte pads an odd length), ``S1 = sum(h_i)`` and ``S2 = sum((i + 1) * h_i)``, both mod
    2^31 - 1, packed as ``S1 << 32 | S2``. Every product and partial sum fits in 64 bits, so the
    GPU (torch, ``infera.engine.vllm.worker.gpu.gpudirect``) and the CPU (numpy here) agree exactly."""
    view = memoryview(data).cast("B")
    if view.nbytes % 2:
        view = memoryview(bytes(view) + b"\0")
    import numpy as np  # (a dependency: the RAM index's table needs it too)

    words_np = np.frombuffer(view, dtype="<u2")
    w0 = np.arange(1, WSUM_PIECE + 1, dtype=np.int64)
    s1 = s2 = 0
    for start in range(0, words_np.size, WSUM_PIECE):
        # sum((start + j + 1) * h_j) = start * sum(h) + sum((j + 1) * h_j): pieces of 2^17 words
        # keep every partial sum below 2^63
        h = words_np[start : start + WSUM_PIECE].astype(np.int64)
        total = int(h.sum())
        s1 += total
        s2 += start * total + int(np.dot(w0[: h.size], h))
    return wsum_combine(s1, s2)
