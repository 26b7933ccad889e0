"""The daemon's key layouts, written down once (docs/design.md, "Key layouts").

* An **ikey** (the RAM index key) is the 2-byte namespace id given out at HELLO (big-endian)
  followed by the client's key. Ids are local to one daemon process.
* An **fkey** (the disk tier's index key) is the namespace **prefix**, the first 8 bytes of the
  namespace digest, followed by the key; it names the file ``v1/<prefix hex>/<fan>/<key hex>.kvcache``
  (:func:`infera.kvd.chunkfile.relpath`).
* A distributed tier names a value from the namespace digest and the key, never from the id, so
  daemons serving one namespace meet: :func:`mooncake_name`, :func:`lmcache_name`.

"Namespace digest" means :func:`infera.kvd.chunkfile.ns_digest` (BLAKE2b-256 of the namespace
text, the same for every daemon) everywhere in the daemon. The id -> :class:`Namespace` cache is
the store's namespace table (:class:`infera.kvd.namespaces.NamespaceTable`, ``store.ns``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from infera.kvd.chunkfile import NS_PREFIX_LEN  # the directory of a chunk file is named by it

NS_ID_LEN = 2


# -- ikey: namespace id + key --------------------------------------------------------------------
def ikey_prefix(ns_id: int) -> bytes:
    """The bytes every ikey of namespace id ``ns_id`` starts with (hot paths add the key to it)."""
    return ns_id.to_bytes(NS_ID_LEN, "big")


def ikey(ns_id: int, key: bytes) -> bytes:
    return ikey_prefix(ns_id) + key


def ns_id_of(ikey: bytes) -> int:
    return int.from_bytes(ikey[:NS_ID_LEN], "big")


def key_of(ikey: bytes) -> bytes:
    """The client's key in an ikey."""
    return ikey[NS_ID_LEN:]


def ns_ids_in(ikeys: Iterable[bytes]) -> set[int]:
    """The namespace ids the ``ikeys`` are keyed by (one slice per key, one int per id)."""
    return {int.from_bytes(p, "big") for p in {k[:NS_ID_LEN] for k in ikeys}}


# -- fkey: namespace prefix + key ----------------------------------------------------------------
def ns_prefix(digest: bytes) -> bytes:
    """The namespace prefix of a namespace digest: what fkeys and directory names carry."""
    return digest[:NS_PREFIX_LEN]


def fkey(prefix: bytes, key: bytes) -> bytes:
    """The fkey of ``key`` in the namespace whose prefix is ``prefix``."""
    return prefix + key


def fkey_key(fkey: bytes) -> bytes:
    """The client's key in an fkey."""
    return fkey[NS_PREFIX_LEN:]


def fkey_prefix(fkey: bytes) -> bytes:
    """The namespace part of an fkey (the first bytes of its digest)."""
    return fkey[:NS_PREFIX_LEN]


# -- distributed-tier names ----------------------------------------------------------------------
MOONCAKE_NAME_VERSION = "kvd1"
LMCACHE_NAME_MAX = 150  # the key field of lmcache_server's request header (tiers/lmcache.py)


def mooncake_name(digest: bytes, key: bytes) -> str:
    """The Mooncake key of chunk ``key`` in the namespace whose digest is ``digest``:
    ``kvd1/<namespace prefix hex>/<key hex>``."""
    return f"{MOONCAKE_NAME_VERSION}/{ns_prefix(digest).hex()}/{key.hex()}"


def lmcache_name(digest: bytes, key: bytes) -> str:
    """The LMCache key of chunk ``key`` in the namespace whose digest is ``digest``:
    ``<namespace prefix hex>@1@0@1<key hex>@uint8``, an LMCache ``model@world_size@worker_id@
    <hex hash>@dtype`` (the leading ``1`` of the hash keeps leading zero bytes of the key: the
    server compares it as an int). The prefix loses bytes so that 64-byte keys fit the
    server's 150 characters."""
    body = f"@1@0@1{key.hex()}@uint8"
    room = min(2 * NS_PREFIX_LEN, LMCACHE_NAME_MAX - len(body))
    return digest[: room // 2].hex() + body


# -- a namespace --------------------------------------------------------------------------------
class Namespace(NamedTuple):
    id: int
    text: str
    digest: bytes  # chunkfile.ns_digest(text), 32 bytes

    @property
    def prefix(self) -> bytes:
        return ns_prefix(self.digest)

    def fkey(self, key: bytes) -> bytes:
        return fkey(self.prefix, key)


__all__ = [
    "LMCACHE_NAME_MAX",
    "MOONCAKE_NAME_VERSION",
    "NS_ID_LEN",
    "NS_PREFIX_LEN",
    "Namespace",
    "fkey",
    "fkey_key",
    "fkey_prefix",
    "ikey",
    "ikey_prefix",
    "key_of",
    "lmcache_name",
    "mooncake_name",
    "ns_id_of",
    "ns_ids_in",
    "ns_prefix",
]
