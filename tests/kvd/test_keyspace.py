"""The daemon's key layouts (infera/kvd/keyspace.py) and its one namespace table (namespaces.py).

The bytes and names pinned here are what RAM, disk files and distributed stores hold today:
a change to any of them makes existing data unreadable (docs/design.md, "Key layouts").
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from helpers import disk_tier_in_process
from infera.kvd import chunkfile as cf
from infera.kvd import keyspace as ks
from infera.kvd import namespaces
from infera.kvd.arena import ALIGN
from infera.kvd.namespaces import NamespaceTable
from infera.kvd.ops import Ops
from infera.kvd.store import LONG, Store
from infera.kvd.tiers import diskfs
from infera.kvd.tiers.lmcache import LMCacheTransport
from infera.kvd.tiers.mooncake import MooncakeTransport

TEXT = "model-a"
DIGEST = bytes.fromhex("02e6aee69655785a006952a17d16f18466df0d26698a49e7448498240c525d95")
PREFIX = bytes.fromhex("02e6aee69655785a")
KEY = b"\x01\x02"


def test_namespace_digest_is_blake2b_256_of_the_text() -> None:
    assert cf.ns_digest(TEXT) == DIGEST
    ns = ks.Namespace(3, TEXT, DIGEST)
    assert ns.prefix == ks.ns_prefix(DIGEST) == PREFIX


def test_ikey_is_the_2_byte_id_then_the_key() -> None:
    ikey = ks.ikey(0x0102, KEY)
    assert ikey == b"\x01\x02" + KEY == ks.ikey_prefix(0x0102) + KEY
    assert ks.ns_id_of(ikey) == 0x0102 and ks.key_of(ikey) == KEY
    assert ks.ns_ids_in([ikey, ks.ikey(7, b"a"), ks.ikey(7, b"b")]) == {0x0102, 7}
    client = cast(Any, SimpleNamespace(ns_id=0x0102))
    keys = [KEY, b"k" * 64]
    assert Ops.ikeys(cast(Any, None), client, keys) == [ks.ikey(0x0102, k) for k in keys]
    store = Store(4 * ALIGN)
    chunk = store.reserve(ikey, 1, LONG).chunk
    assert chunk is not None and chunk.ns_id == 0x0102 and chunk.key == KEY


def test_fkey_is_the_8_byte_prefix_then_the_key_and_names_the_file(tmp_path: Path) -> None:
    fkey = ks.Namespace(3, TEXT, DIGEST).fkey(KEY)
    assert fkey == PREFIX + KEY == ks.fkey(PREFIX, KEY)
    assert ks.fkey_prefix(fkey) == PREFIX and ks.fkey_key(fkey) == KEY
    root = str(tmp_path)
    path = os.path.join(root, "v1", "02e6aee69655785a", "eb", "0102.kvcache")
    assert diskfs.file_path(root, fkey) == path == cf.chunk_path(root, TEXT, KEY)
    assert cf.relpath(DIGEST, KEY) == "v1/02e6aee69655785a/eb/0102.kvcache"


def test_distributed_tier_names_are_pinned() -> None:
    mooncake = object.__new__(MooncakeTransport)  # no client needed to name a value
    lmcache = object.__new__(LMCacheTransport)
    assert ks.mooncake_name(DIGEST, KEY) == mooncake.name(DIGEST, KEY) == "kvd1/02e6aee69655785a/0102"
    assert ks.lmcache_name(DIGEST, KEY) == lmcache.name(DIGEST, KEY) == "02e6aee69655785a@1@0@10102@uint8"
    assert ks.lmcache_name(DIGEST, b"\x00\x01") == "02e6aee69655785a@1@0@10001@uint8"
    # the digest part shrinks so that 64-byte keys fit the server's 150 characters
    for n, digest_hex in ((61, "02e6aee69655785a"), (62, "02e6aee6965578"), (64, "02e6aee696")):
        name = ks.lmcache_name(DIGEST, b"\xff" * n)
        assert name == f"{digest_hex}@1@0@1{'ff' * n}@uint8" and len(name) == ks.LMCACHE_NAME_MAX
    assert ks.mooncake_name(DIGEST, b"\xff" * 64) == "kvd1/02e6aee69655785a/" + "ff" * 64


def test_the_table_computes_a_namespace_once_and_maps_fkeys_back() -> None:
    table = NamespaceTable()
    nid = table.acquire(TEXT)
    ikey = ks.ikey(nid, KEY)
    assert table.ikey_of(PREFIX + KEY) is None, "a namespace not seen yet maps no fkey"
    ns = table.of(ikey)
    assert ns == ks.Namespace(nid, TEXT, DIGEST) and table.of(ks.ikey(nid, b"other")) is ns
    assert table.fkey(ikey) == PREFIX + KEY and table.ikey_of(PREFIX + KEY) == ikey


def _reused(table: NamespaceTable, old: str, new: str, free: Any) -> int:
    nid = table.acquire(old)
    ikey = ks.ikey(nid, KEY)
    assert table.of(ikey).digest == cf.ns_digest(old)
    old_fkey = table.fkey(ikey)
    free(nid)
    assert table.acquire(new) == nid, "the freed id is reused"
    ns = table.of(ikey)
    assert ns == ks.Namespace(nid, new, cf.ns_digest(new)), "a reused id gets the new namespace"
    assert table.fkey(ikey) == ks.ns_prefix(cf.ns_digest(new)) + KEY
    assert table.ikey_of(old_fkey) is None, "the old namespace's files no longer map to the id"
    return nid


def test_a_freed_id_reused_for_another_namespace_gets_the_new_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # freed at once: no connection holds it and nothing beyond HELLO ran in it
    table = NamespaceTable()
    _reused(table, "a", "b", table.release)

    # freed by a reclaim: used, then no connection and no chunk refers to it
    monkeypatch.setattr(namespaces, "NS_IDS", 2)
    table = NamespaceTable()
    keep = table.acquire("kept")
    held = [ks.ikey(keep, b"chunk")]

    def reclaimed(nid: int) -> None:
        table.mark_used(nid)
        table.release(nid)
        assert table.of(ks.ikey(nid, KEY)).text == "used", "kept while it may key chunks"
        with pytest.raises(ValueError, match="too many namespaces"):
            table.acquire("no-reclaim")  # without in_use nothing is reclaimed
        assert table.reclaim(lambda: held) == 1

    _reused(table, "used", "after", reclaimed)
    assert table.of(held[0]).text == "kept"


def test_the_store_ops_and_tiers_share_one_namespace_table(tmp_path: Path) -> None:
    with disk_tier_in_process(tmp_path) as (store, tier):
        assert tier.ns is store.ns and tier.writes.ns is store.ns and tier.reads.ns is store.ns
        nid = store.ns_id(TEXT)
        res = store.reserve(ks.ikey(nid, KEY), 10, LONG)
        assert res.chunk is not None
        assert tier.address(res.chunk, store.ns.of(res.chunk.ikey)) == PREFIX + KEY
        store.abort(res.chunk)
