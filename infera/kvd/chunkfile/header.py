"""The 4 KiB chunk-file header: pack, unpack and validate, and build one for a payload."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from infera.kvd.chunkfile.format import (
    ALGO_XXH3_64,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_KEY,
    Buffer,
    CorruptChunk,
    OtherVersion,
    checksum,
    default_algo,
)
from infera.kvd.chunkfile.names import ns_digest

# magic, version, header size, algo, retention, flags, payload length, payload checksum (16 bytes,
# little-endian, zero padded), created (ns since the epoch), namespace digest, key length, key,
# namespace text length; the namespace text follows; the header checksum sits in the last 8 bytes.
_FIXED = struct.Struct("<8sHHHBBQ16sQ32sB64sH")
_HCHECK = struct.Struct("<Q")
HCHECK_OFFSET = HEADER_SIZE - _HCHECK.size
NS_TEXT_MAX = HCHECK_OFFSET - _FIXED.size
FLAG_NS_TRUNCATED = 1


@dataclass
class ChunkHeader:
    key: bytes
    namespace_digest: bytes
    payload_length: int
    payload_checksum: int
    algo: int = ALGO_XXH3_64
    retention: int = 3  # protocol code of "long"
    created_ns: int = 0
    namespace: str = ""
    flags: int = 0
    version: int = FORMAT_VERSION

    def pack(self) -> bytes:
        """The 4096-byte header, header checksum included."""
        if not 1 <= len(self.key) <= MAX_KEY:
            raise ValueError("chunk keys are 1 to 64 bytes")
        text = self.namespace.encode()
        flags = self.flags & ~FLAG_NS_TRUNCATED
        if len(text) > NS_TEXT_MAX:
            text = text[:NS_TEXT_MAX].decode(errors="ignore").encode()
            flags |= FLAG_NS_TRUNCATED
        buf = bytearray(HEADER_SIZE)
        _FIXED.pack_into(
            buf,
            0,
            MAGIC,
            self.version,
            HEADER_SIZE,
            self.algo,
            self.retention,
            flags,
            self.payload_length,
            self.payload_checksum.to_bytes(16, "little"),
            self.created_ns,
            self.namespace_digest,
            len(self.key),
            self.key,
            len(text),
        )
        buf[_FIXED.size : _FIXED.size + len(text)] = text
        _HCHECK.pack_into(buf, HCHECK_OFFSET, checksum(self.algo, memoryview(buf)[:HCHECK_OFFSET]))
        return bytes(buf)

    @staticmethod
    def fields(buf: Buffer) -> tuple[int, int, int, int, int, int, bytes, int, bytes, int, bytes, int]:
        """Validate a header and return its fixed fields (raises CorruptChunk or OtherVersion):
        version, algo, retention, flags, payload length, created, payload checksum bytes, the
        namespace text length, namespace digest, key length, key (padded), the header size."""
        if len(buf) < HEADER_SIZE:
            raise CorruptChunk(f"truncated header ({len(buf)} of {HEADER_SIZE} bytes)")
        (magic, version, hsize, algo, retention, flags, plen, csum, created, digest, klen, key, tlen) = (
            _FIXED.unpack_from(buf, 0)
        )
        if magic != MAGIC:
            raise CorruptChunk("bad magic: not a kvd chunk file")
        if version != FORMAT_VERSION:
            raise OtherVersion(f"chunk format version {version} (this daemon reads {FORMAT_VERSION})")
        if hsize != HEADER_SIZE:
            raise CorruptChunk(f"header size {hsize} is not {HEADER_SIZE}")
        (stored,) = _HCHECK.unpack_from(buf, HCHECK_OFFSET)
        if checksum(algo, memoryview(buf)[:HCHECK_OFFSET]) != stored:
            raise CorruptChunk("header checksum mismatch")
        if not 1 <= klen <= MAX_KEY or tlen > NS_TEXT_MAX:
            raise CorruptChunk("header fields out of range")
        return version, algo, retention, flags, plen, created, csum, tlen, digest, klen, key, hsize

    @staticmethod
    def peek(buf: Buffer) -> tuple[bytes, bytes, int]:
        """(key, namespace digest, payload length) of a header, validated as :meth:`unpack` does
        but without building the object (the start-up scan's check, once per file)."""
        f = ChunkHeader.fields(buf)
        return f[10][: f[9]], f[8], f[4]

    @classmethod
    def unpack(cls, buf: Buffer) -> ChunkHeader:
        """Parse and validate a header (raises CorruptChunk or OtherVersion)."""
        version, algo, retention, flags, plen, created, csum, tlen, digest, klen, key, _h = cls.fields(buf)
        text = bytes(buf[_FIXED.size : _FIXED.size + tlen]).decode(errors="replace")
        return cls(
            key=key[:klen],
            namespace_digest=digest,
            payload_length=plen,
            payload_checksum=int.from_bytes(csum, "little"),
            algo=algo,
            retention=retention,
            created_ns=created,
            namespace=text,
            flags=flags,
            version=version,
        )


def make_header(
    namespace: str | bytes,
    key: bytes,
    payload: Buffer,
    *,
    retention: int = 3,
    algo: int | None = None,
    namespace_text: str = "",
) -> ChunkHeader:
    """Build the header for ``payload`` (computes its checksum). ``namespace`` is the text or
    its precomputed 32-byte digest (then ``namespace_text`` is the text to record)."""
    algo = default_algo() if algo is None else algo
    if isinstance(namespace, str):
        digest, text = ns_digest(namespace), namespace
    else:
        digest, text = namespace, namespace_text
    return ChunkHeader(
        key=key,
        namespace_digest=digest,
        payload_length=memoryview(payload).nbytes,
        payload_checksum=checksum(algo, payload),
        algo=algo,
        retention=retention,
        created_ns=time.time_ns(),
        namespace=text,
    )
