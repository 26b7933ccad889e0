"""The daemon's key layouts, written down once.

* An **ikey** (the RAM index key) is the 2-byte namespace id given out at HELLO (big-endian)
  followed by the client's key. Ids are local to one daemon process.
* An **fkey** (the disk tier's index key) is the first 8 bytes of the namespace digest
  (:func:`infera.kvd.chunkfile.ns_digest` of the namespace text: the same for every daemon)
  followed by the key; it names the file ``v1/<fkey[:8] hex>/<fan>/<key hex>.kvcache``.
* A distributed tier names a value from the namespace digest and the key
  (``Transport.name``), never from the id, so daemons serving one namespace meet.

:class:`Namespaces` turns an id into its text and digest, once per id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from infera.kvd.chunkfile import ns_digest

NS_ID_LEN = 2
NS_PREFIX_LEN = 8


def ikey(ns_id: int, key: bytes) -> bytes:
    return ns_id.to_bytes(NS_ID_LEN, "big") + key


def ns_id_of(ikey: bytes) -> int:
    return int.from_bytes(ikey[:NS_ID_LEN], "big")


def key_of(ikey: bytes) -> bytes:
    return ikey[NS_ID_LEN:]


def fkey_key(fkey: bytes) -> bytes:
    """The client's key in an fkey."""
    return fkey[NS_PREFIX_LEN:]


def fkey_prefix(fkey: bytes) -> bytes:
    """The namespace part of an fkey (the first bytes of its digest)."""
    return fkey[:NS_PREFIX_LEN]


class Namespace(NamedTuple):
    id: int
    text: str
    digest: bytes  # chunkfile.ns_digest(text), 32 bytes

    @property
    def prefix(self) -> bytes:
        return self.digest[:NS_PREFIX_LEN]


class Namespaces:
    """Namespace id -> :class:`Namespace`, computed on first use from ``name_of(id)`` (loop
    thread only). Also maps an fkey back to the ikey of a namespace seen so far."""

    def __init__(self, name_of: Callable[[int], str]) -> None:
        self._name_of = name_of
        self._by_id: dict[int, Namespace] = {}
        self._by_prefix: dict[bytes, int] = {}

    def of(self, ikey: bytes) -> Namespace:
        nid = ns_id_of(ikey)
        ns = self._by_id.get(nid)
        if ns is None:
            text = self._name_of(nid)
            ns = self._by_id[nid] = Namespace(nid, text, ns_digest(text))
            self._by_prefix[ns.prefix] = nid
        return ns

    def fkey(self, ikey: bytes) -> bytes:
        return self.of(ikey).prefix + key_of(ikey)

    def ikey_of(self, fkey: bytes) -> bytes | None:
        """The ikey of ``fkey``, if its namespace has been seen (else no chunk of it is in RAM)."""
        nid = self._by_prefix.get(fkey_prefix(fkey))
        return None if nid is None else ikey(nid, fkey_key(fkey))


__all__ = ["NS_ID_LEN", "NS_PREFIX_LEN", "Namespace", "Namespaces", "fkey_key", "fkey_prefix", "ikey"]
