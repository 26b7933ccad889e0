"""docs/namespace.md, held to the code: every item it lists changes the namespace (or the key),
every input of the weights fingerprint changes the fingerprint, and the table and ``EngineFacts``
cannot drift apart."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from test_keys import facts as tiny_llama_facts

from infera.engine.vllm import keys as K
from infera.engine.vllm.weights import hub_snapshot, weights_info

DOC = Path(__file__).resolve().parents[2] / "docs" / "namespace.md"


def facts(**over: Any) -> K.EngineFacts:
    """test_keys' tiny Llama with a weights fingerprint, so that changing the weights shows."""
    return tiny_llama_facts(**{"weights": "0123456789abcdef", **over})


#: One change per documented item: the namespace of the changed facts must differ.
FACT_CHANGES: dict[str, dict[str, Any]] = {
    "model": {"model": "/models/other"},
    "model_type": {"model_type": "qwen2"},
    "weights": {"weights": "fedcba9876543210"},
    "quantization": {"quantization": "fp8"},
    "dtype": {"dtype": "float16"},
    "kv_cache_dtype": {"kv_cache_dtype": "fp8"},
    "num_layers": {"num_layers": 3},
    "total_kv_heads": {"total_kv_heads": 4},
    "kv_heads_per_rank": {"kv_heads_per_rank": 1},
    "head_size": {"head_size": 64},
    "use_mla": {"use_mla": True},
    "bytes_per_token": {"bytes_per_token": 1024},
    "platform": {"platform": "cuda"},
    "block_size": {"block_size": 16},
    "hash_block_size": {"hash_block_size": 16},
    "tp_size": {"tp_size": 2},
    "pp_size": {"pp_size": 2},
    "hash_algo": {"hash_algo": "sha256_cbor"},
    "hash_seed": {"hash_seed": "env:0"},
    "vllm_version": {"vllm_version": "0.26"},
    "extra": {"extra": {"lora": "a"}},
}
OTHER_CASES = {"chunk_tokens", "format", "rank", "chunk_hash"}


def _cases(cell: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", cell))


def _coverage_rows() -> list[list[str]]:
    text = DOC.read_text()
    block = text.split("<!-- namespace-coverage:start -->", 1)[1].split("<!-- namespace-coverage:end -->", 1)[
        0
    ]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")][2:]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]


def test_the_docs_table_and_engine_facts_agree() -> None:
    rows = _coverage_rows()
    # the field names lead the cell; what follows " (" or ":" explains them
    documented_fields = set().union(*(_cases(re.split(r" \(|:", r[1], maxsplit=1)[0]) for r in rows))
    fields = {f.name for f in dataclasses.fields(K.EngineFacts)} | {"chunk_tokens", "format"}
    assert documented_fields == fields, "docs/namespace.md must list exactly the namespace's facts"
    documented_cases = set().union(*(_cases(r[2]) for r in rows))
    assert documented_cases == set(FACT_CHANGES) | {"chunk_tokens", "format"}


def test_the_docs_name_a_test_case_for_every_key_item() -> None:
    text = DOC.read_text().split("## In the key, not the namespace", 1)[1].split("## The weights", 1)[0]
    named = set().union(
        *(_cases(ln.split("|")[3]) for ln in text.splitlines() if ln.startswith("| ") and "where" not in ln)
    )
    assert named - {"kvd"} <= OTHER_CASES | set(FACT_CHANGES)
    assert {"rank", "chunk_hash"} <= named


@pytest.mark.parametrize("item", sorted(FACT_CHANGES))
def test_changing_a_fact_changes_the_namespace(item: str) -> None:
    base = K.make_namespace(facts(), 256)
    changed = K.make_namespace(facts(**FACT_CHANGES[item]), 256)
    assert changed.digest != base.digest
    assert changed.name != base.name


def test_changing_chunk_tokens_changes_the_namespace() -> None:
    assert K.make_namespace(facts(), 256).digest != K.make_namespace(facts(), 128).digest


def test_changing_the_format_version_changes_the_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    base = K.make_namespace(facts(), 256)
    monkeypatch.setattr(K, "FORMAT_VERSION", K.FORMAT_VERSION + 1)
    assert K.make_namespace(facts(), 256).digest != base.digest


def test_rank_and_chunk_hash_change_the_key() -> None:
    ns = K.make_namespace(facts(), 256).digest
    h = b"h" * 32
    assert K.chunk_key(ns, h, 0) != K.chunk_key(ns, h, 1)
    assert K.chunk_key(ns, h, 0) != K.chunk_key(ns, b"s" * 32, 0)  # e.g. the same tokens with a cache_salt


def test_the_name_shows_the_weights() -> None:
    ns = K.make_namespace(facts(), 256)
    assert ns.name.startswith("vllm/tiny/w:01234567/")
    assert ns.weights == "0123456789abcdef"
    assert K.make_namespace(facts(weights=""), 256).name.startswith("vllm/tiny/") and "w:" not in (
        K.make_namespace(facts(weights=""), 256).name
    )


# -- the weights fingerprint ------------------------------------------------------------------------


def _model(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    (d / "model-00001-of-00002.safetensors").write_bytes(b"a" * 1000)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"b" * 1000)
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}})
    )
    (d / "tokenizer.json").write_text("{}")
    for p in d.iterdir():
        os.utime(p, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    return d


def _fp(d: Path, **kw: Any) -> str:
    return weights_info(str(d), **kw).fingerprint


def _bump(p: Path) -> None:
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _rename(d: Path) -> None:
    (d / "model-00002-of-00002.safetensors").rename(d / "model-00002-of-00003.safetensors")


def _resize(d: Path) -> None:
    p = d / "model-00002-of-00002.safetensors"
    st = p.stat()
    p.write_bytes(b"b" * 1001)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # same time: the size alone tells


def _retime(d: Path) -> None:
    _bump(d / "model-00001-of-00002.safetensors")


def _add(d: Path) -> None:
    (d / "adapter.safetensors").write_bytes(b"c")


def _index(d: Path) -> None:
    p = d / "model.safetensors.index.json"
    st = p.stat()
    p.write_text(json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}}))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _config(d: Path) -> None:
    p = d / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "rope_theta": 1.0}))


FILE_CHANGES = {
    "file_name": _rename,
    "file_size": _resize,
    "file_mtime": _retime,
    "file_added": _add,
    "index": _index,
    "config": _config,
}


@pytest.mark.parametrize("case", sorted(FILE_CHANGES))
def test_changing_a_weights_input_changes_the_fingerprint(tmp_path: Path, case: str) -> None:
    d = _model(tmp_path / "m")
    before = _fp(d)
    assert _fp(d) == before, "stable while nothing changes"
    FILE_CHANGES[case](d)
    assert _fp(d) != before


def test_files_that_are_not_weights_do_not_count(tmp_path: Path) -> None:
    d = _model(tmp_path / "m")
    before = _fp(d)
    (d / "tokenizer.json").write_text('{"changed": true}')
    (d / "README.md").write_text("hello")
    assert _fp(d) == before


def test_revision_model_weights_and_dummy_change_the_fingerprint(tmp_path: Path) -> None:
    d = _model(tmp_path / "m")
    base = _fp(d)
    assert _fp(d, revision="v2") != base
    assert _fp(d, model_weights="s3://bucket/m") != base
    dummy = weights_info(str(d), load_format="dummy")
    assert dummy.source == "dummy" and dummy.fingerprint != base
    assert _fp(d, load_format="safetensors") == base


def test_a_single_weight_file_is_fingerprinted(tmp_path: Path) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"g" * 10)
    before = weights_info(str(f))
    assert before.source == "file" and before.files[0][:2] == ("model.gguf", 10)
    _bump(f)
    assert weights_info(str(f)).fingerprint != before.fingerprint


def _hub(cache: Path, repo: str, commit: str, ref: str = "main") -> Path:
    base = cache / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / ref).write_text(commit)
    snap = base / "snapshots" / commit
    blobs = base / "blobs"
    blobs.mkdir(exist_ok=True)
    blob = blobs / f"blob-{commit[:6]}"
    blob.write_bytes(commit.encode() * 10)
    snap.mkdir(parents=True, exist_ok=True)
    link = snap / "model.safetensors"
    if not link.exists():
        link.symlink_to(os.path.relpath(blob, snap))
    return snap


def test_hub_ids_resolve_the_cached_commit(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    env = {"HF_HUB_CACHE": str(cache)}
    a, b = "a" * 40, "b" * 40
    snap = _hub(cache, "org/tiny", a)
    assert hub_snapshot("org/tiny", None, str(cache)) == (a, str(snap))
    first = weights_info("org/tiny", environ=env)
    assert first.source == "hub-cache" and first.revision == a and first.files[0][0] == "model.safetensors"
    _hub(cache, "org/tiny", b)  # main now points at a new commit
    second = weights_info("org/tiny", environ=env)
    assert second.revision == b and second.fingerprint != first.fingerprint
    pinned = weights_info("org/tiny", revision=a, environ=env)
    assert pinned.fingerprint == first.fingerprint


def test_hub_commit_case(tmp_path: Path) -> None:
    """``hub_commit`` in the docs: without a cached snapshot the id and revision are all there is."""
    env = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    a = weights_info("org/tiny", environ=env)
    assert a.source == "hub"
    assert weights_info("org/tiny", revision="v2", environ=env).fingerprint != a.fingerprint
    assert weights_info("org/other", environ=env).fingerprint != a.fingerprint


def test_the_docs_name_a_case_for_every_weights_input() -> None:
    text = DOC.read_text().split("## The weights fingerprint", 1)[1]
    named = set().union(
        *(_cases(ln.split("|")[3]) for ln in text.splitlines() if ln.startswith("| ") and "input" not in ln)
    )
    assert named == set(FILE_CHANGES) | {"revision", "hub_commit", "model_weights", "dummy"}
