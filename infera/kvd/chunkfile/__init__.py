"""The long tier's chunk file: a self-describing, checksummed file per chunk.

One file holds one chunk: a 4 KiB header, then the payload at offset 4096, so the payload starts
on a page boundary and can be read with O_DIRECT, cuFile or hipFile straight into aligned memory.
The header is enough to validate the file without asking the daemon: magic, format version,
checksum algorithm, namespace digest, key, payload length and payload checksum, itself protected
by a header checksum. docs/chunk-format.md is the reference; this package is the implementation
the daemon, the benchmarks and the connector's GPU-direct path share: :mod:`.format` (constants,
errors, checksums), :mod:`.names` (paths), :mod:`.header`, :mod:`.write` and :mod:`.read`.

Where a chunk lives is a pure function of (namespace, key)::

    <root>/v1/<ns16>/<fan>/<keyhex>.kvcache

``ns16`` is the first 8 bytes (16 hex digits) of the namespace digest, ``fan`` is one byte of a
digest of the key (256 subdirectories per namespace), ``keyhex`` the key in lowercase hex. A
writer creates the file under a temporary name starting with ``.`` in the same directory and
renames it into place, so a reader never sees a partial file under a chunk name. Every file the
writers create is opened relative to a directory descriptor with ``O_CREAT | O_EXCL | O_NOFOLLOW``
under a random temporary name, and the directories on the way are opened with ``O_NOFOLLOW``: a
symbolic link planted in the tree is never followed (see :func:`open_dir_at`).
"""

from __future__ import annotations

from infera.kvd.chunkfile.format import (
    ALGO_CRC32,
    ALGO_NAMES,
    ALGO_WSUM31,
    ALGO_XXH3_64,
    EXT,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_KEY,
    NAMESPACE_FILE,
    NS_PREFIX_LEN,
    QUARANTINE_DIR,
    TMP_SUFFIX,
    VERSION_DIR,
    WSUM_MOD,
    WSUM_PIECE,
    Buffer,
    ChunkFileError,
    CorruptChunk,
    NotRegular,
    OtherVersion,
    SizeChanged,
    checksum,
    default_algo,
    wsum31,
    wsum_combine,
)
from infera.kvd.chunkfile.header import (
    FLAG_NS_TRUNCATED,
    HCHECK_OFFSET,
    NS_TEXT_MAX,
    ChunkHeader,
    make_header,
)
from infera.kvd.chunkfile.names import (
    chunk_path,
    fan_dirname,
    file_name,
    is_temp_name,
    key_from_name,
    ns_digest,
    ns_dirname,
    relpath,
)
from infera.kvd.chunkfile.read import open_regular, open_regular_stat, read_chunk, read_header, read_into
from infera.kvd.chunkfile.write import (
    ensure_dir,
    ensure_dir_at,
    open_dir_at,
    skip_done,
    temp_name,
    write_chunk,
    write_file,
    write_file_at,
    write_small_file,
    write_small_file_at,
)

__all__ = [
    "ALGO_CRC32",
    "ALGO_NAMES",
    "ALGO_WSUM31",
    "ALGO_XXH3_64",
    "EXT",
    "FLAG_NS_TRUNCATED",
    "FORMAT_VERSION",
    "HCHECK_OFFSET",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_KEY",
    "NAMESPACE_FILE",
    "NS_PREFIX_LEN",
    "NS_TEXT_MAX",
    "QUARANTINE_DIR",
    "TMP_SUFFIX",
    "VERSION_DIR",
    "WSUM_MOD",
    "WSUM_PIECE",
    "Buffer",
    "ChunkFileError",
    "ChunkHeader",
    "CorruptChunk",
    "NotRegular",
    "OtherVersion",
    "SizeChanged",
    "checksum",
    "chunk_path",
    "default_algo",
    "ensure_dir",
    "ensure_dir_at",
    "fan_dirname",
    "file_name",
    "is_temp_name",
    "key_from_name",
    "make_header",
    "ns_digest",
    "ns_dirname",
    "open_dir_at",
    "open_regular",
    "open_regular_stat",
    "read_chunk",
    "read_header",
    "read_into",
    "relpath",
    "skip_done",
    "temp_name",
    "write_chunk",
    "write_file",
    "write_file_at",
    "write_small_file",
    "write_small_file_at",
    "wsum31",
    "wsum_combine",
]
