"""Chunk sizing, namespaces and chunk keys: the pieces every half of the connector must agree on."""

from __future__ import annotations

import dataclasses

import pytest
from connector_kit import engine_facts

from infera.engine.vllm import keys as K


def facts(**over: object) -> K.EngineFacts:
    """A tiny Llama on CPU (2 layers, 2 KV heads of 32, 128-token blocks); ``over`` replaces fields."""
    return dataclasses.replace(engine_facts(model="/models/tiny", block_size=128), **over)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bytes_per_token", "block_size", "expected"),
    [
        (512, 128, 256),  # tiny model: capped at 256 tokens
        (128 * 1024, 16, 32),  # Llama-3-8B bf16: 4 MiB / 128 KiB = 32 tokens
        (320 * 1024, 16, 16),  # Llama-70B TP1: 12.8 tokens -> one block
        (4 << 20, 16, 16),  # a block is more than 4 MiB: still one block
        (64, 256, 256),  # a block bigger than the 256-token cap: one block
    ],
)
def test_auto_chunk_tokens_ram_path(bytes_per_token: int, block_size: int, expected: int) -> None:
    got = K.auto_chunk_tokens(bytes_per_token, block_size)
    assert got == expected
    assert got % block_size == 0


def test_auto_chunk_tokens_gpu_direct_reaches_128_mib() -> None:
    per_token = 128 * 1024
    got = K.auto_chunk_tokens(per_token, 16, gpu_direct=True)
    assert got % 16 == 0
    assert got * per_token >= 128 << 20
    assert (got - 16) * per_token < 128 << 20


def test_fixed_chunk_tokens_round_up_to_blocks() -> None:
    assert K.resolve_chunk_tokens(100, 512, 128) == 128
    assert K.resolve_chunk_tokens(256, 512, 128) == 256
    assert K.resolve_chunk_tokens(None, 512, 128) == 256


@pytest.mark.parametrize(
    ("seed", "algo", "fixed_release", "expected"),
    [
        (None, "sha256", True, "fixed"),
        (None, "sha256", False, "random"),
        (None, "xxhash", True, "random"),
        ("0", "sha256", True, "env:0"),
        ("0", "sha256", False, "env:0"),
    ],
)
def test_hash_seed_mode(seed: str | None, algo: str, fixed_release: bool, expected: str) -> None:
    assert K.hash_seed_mode(seed, algo, fixed_release) == expected


def test_namespace_is_stable_and_readable() -> None:
    a = K.make_namespace(facts(), 256)
    b = K.make_namespace(facts(), 256)
    assert a == b
    assert a.name.startswith("vllm/tiny/")
    assert len(a.name) < 1024
    assert a.hash_settings == {"algo": "sha256", "seed": "fixed", "block_size": 128}


@pytest.mark.parametrize(
    "change",
    [
        {"model": "/models/other"},
        {"kv_cache_dtype": "fp8"},
        {"block_size": 16, "hash_block_size": 16},
        {"tp_size": 2, "kv_heads_per_rank": 1},
        {"hash_seed": "env:0"},
        {"hash_algo": "sha256_cbor"},
        {"num_layers": 3},
        {"vllm_version": "0.26"},
    ],
)
def test_namespace_changes_with_anything_that_changes_the_bytes(change: dict[str, object]) -> None:
    assert K.make_namespace(facts(**change), 256).digest != K.make_namespace(facts(), 256).digest


def test_namespace_changes_with_chunk_tokens() -> None:
    assert K.make_namespace(facts(), 256).digest != K.make_namespace(facts(), 128).digest


def test_random_seed_gets_a_per_process_fingerprint() -> None:
    settings, fp = K.hash_settings_of(facts(hash_seed="random"))
    assert settings["seed"] == "random"
    assert fp.startswith("random-")
    _, fixed = K.hash_settings_of(facts())
    assert not fixed.startswith("random-")


def test_chunk_hashes_pick_the_last_block_of_each_chunk() -> None:
    blocks = [bytes([i]) * 32 for i in range(8)]
    # 256-token chunks of 128-token blocks: blocks 1, 3, 5, 7 end chunks 0..3.
    assert K.chunk_hashes(blocks, 256, 128, 1000) == [blocks[1], blocks[3], blocks[5]]
    assert K.chunk_hashes(blocks, 256, 128, 1024) == [blocks[1], blocks[3], blocks[5], blocks[7]]
    assert K.chunk_hashes(blocks[:3], 256, 128, 1024) == [blocks[1]]
    with pytest.raises(ValueError):
        K.chunk_hashes(blocks, 200, 128, 1000)


def test_chunk_keys_depend_on_namespace_rank_and_hash() -> None:
    ns1, ns2 = b"a" * 16, b"b" * 16
    h = b"h" * 32
    k = K.chunk_key(ns1, h, 0)
    assert len(k) == K.KEY_BYTES
    assert k == K.chunk_key(ns1, h, 0)
    assert len({k, K.chunk_key(ns2, h, 0), K.chunk_key(ns1, h, 1), K.chunk_key(ns1, b"g" * 32, 0)}) == 4


def test_lookup_keys_are_chunk_major_over_ranks() -> None:
    from infera.engine.vllm import groups

    ns, hashes = b"n" * 16, [b"x" * 32, b"y" * 32]
    got, _ = groups.plan_keys(groups.single_group(16, 256), ns, hashes, 2)
    assert got == [
        K.chunk_key(ns, hashes[0], 0),
        K.chunk_key(ns, hashes[0], 1),
        K.chunk_key(ns, hashes[1], 0),
        K.chunk_key(ns, hashes[1], 1),
    ]


def test_a_keyer_makes_the_same_keys_as_chunk_key() -> None:
    """The workers and plan_keys make keys through chunk_keyer (one hash prefix, copied per
    key): any difference from chunk_key would make every lookup of a stored prompt miss."""
    ns, hashes = b"n" * 16, [bytes([i]) * 32 for i in range(5)]
    for rank, group in ((0, b""), (3, b""), (1, b"g" * 8)):
        make = K.chunk_keyer(ns, rank, group)
        assert [make(h) for h in hashes] == [K.chunk_key(ns, h, rank, group) for h in hashes]
        assert make(memoryview(hashes[0])) == K.chunk_key(ns, hashes[0], rank, group)
    assert K.chunk_keyer(ns, 0, b"g" * 8)(hashes[0]) != K.chunk_keyer(ns)(hashes[0])
