"""Where a chunk file lives: a pure function of (namespace, key), ``<root>/v1/<ns16>/<fan>/<keyhex>.kvcache``."""

from __future__ import annotations

import hashlib
import os

from infera.kvd.chunkfile.format import EXT, MAX_KEY, NS_PREFIX_LEN, TMP_SUFFIX, VERSION_DIR


def ns_digest(namespace: str) -> bytes:
    """The 32-byte namespace digest stored in headers (BLAKE2b-256 of the UTF-8 text)."""
    return hashlib.blake2b(namespace.encode(), digest_size=32).digest()


def ns_dirname(digest: bytes) -> str:
    return digest[:NS_PREFIX_LEN].hex()


def fan_dirname(key: bytes) -> str:
    return hashlib.blake2b(key, digest_size=1).hexdigest()


def file_name(key: bytes) -> str:
    return key.hex() + EXT


def relpath(digest: bytes, key: bytes) -> str:
    """Path of a chunk file under the tier root, from the namespace digest and the key."""
    return os.path.join(VERSION_DIR, ns_dirname(digest), fan_dirname(key), file_name(key))


def chunk_path(root: str, namespace: str, key: bytes) -> str:
    """Where the chunk (namespace, key) lives under ``root``: no daemon needed to find it."""
    return os.path.join(root, relpath(ns_digest(namespace), key))


def key_from_name(name: str) -> bytes | None:
    """The key encoded in a chunk file name, or None for anything else (temp files included)."""
    if not name.endswith(EXT) or name.startswith("."):
        return None
    stem = name[: -len(EXT)]
    if not stem or len(stem) > 2 * MAX_KEY:
        return None
    try:
        return bytes.fromhex(stem)
    except ValueError:
        return None


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)
