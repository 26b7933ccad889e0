"""What the connector says once at engine start, without vLLM: a random hash seed (with the cause
:func:`infera.keyrules.random_seed_reason` names), chunks no prompt can fill, a kv_role other
than kv_both, and kv_connector_extra_config keys it does not read."""

from __future__ import annotations

import logging

import pytest
from connector_kit import engine_facts

from infera.engine.vllm import notices


def _start(caplog: pytest.LogCaptureFixture, **kw: object) -> list[str]:
    args: dict[str, object] = {
        "chunk_tokens": 256,
        "max_model_len": 2048,
        "use": notices.role_use("kv_both"),
        "extra_config": {},
        "failure_policy": "recompute",
    }
    facts = kw.pop("facts", engine_facts())
    args.update(kw)
    with caplog.at_level(logging.INFO, logger="infera.engine.vllm"):
        caplog.clear()
        notices.log_start(facts, **args)  # type: ignore[arg-type]
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_plain_engine_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert _start(caplog) == []


def test_xxhash_without_a_seed_names_the_algorithm_not_the_vllm_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    facts = engine_facts(hash_algo="xxhash", hash_seed="random", vllm_version="0.32")
    (line,) = _start(caplog, facts=facts)
    assert "hash algorithm xxhash draws a random seed per process when PYTHONHASHSEED is unset" in line
    assert "vLLM 0.32" not in line and "seeds block hashes randomly" not in line


def test_an_old_vllm_without_a_seed_names_the_release(caplog: pytest.LogCaptureFixture) -> None:
    (line,) = _start(caplog, facts=engine_facts(hash_seed="random", vllm_version="0.26"))
    assert "vLLM 0.26 draws a random seed per process when PYTHONHASHSEED is unset" in line


@pytest.mark.parametrize(
    ("chunk", "limit", "warned"), [(100_000, 2048, True), (2048, 2048, True), (256, 2048, False)]
)
def test_chunks_no_prompt_can_fill_are_said_once(
    caplog: pytest.LogCaptureFixture, chunk: int, limit: int, warned: bool
) -> None:
    lines = _start(caplog, chunk_tokens=chunk, max_model_len=limit)
    if not warned:
        assert lines == []
        return
    (line,) = lines
    assert f"a chunk is {chunk} tokens but max_model_len is {limit}" in line
    assert "INFERA_KVD_CHUNK_TOKENS" in line and "--max-model-len" in line


@pytest.mark.parametrize(
    ("role", "loads", "saves", "words"),
    [
        ("kv_both", True, True, None),
        ("kv_producer", False, True, "loads no hits"),
        ("kv_consumer", True, False, "stores nothing"),
        ("nonsense", True, True, None),
    ],
)
def test_kv_role_is_honoured_and_said(
    caplog: pytest.LogCaptureFixture, role: str, loads: bool, saves: bool, words: str | None
) -> None:
    use = notices.role_use(role)
    assert (use.loads, use.saves) == (loads, saves)
    lines = _start(caplog, use=use)
    if words is None:
        assert lines == []
    else:
        (line,) = lines
        assert f"kv_role is {role}" in line and words in line and "kv_both" in line


def test_extra_config_keys_are_named_with_the_variable_to_use(caplog: pytest.LogCaptureFixture) -> None:
    (line,) = _start(caplog, extra_config={"chunk_tokens": "abc", "socket": 5, "foo": 1})
    assert "kv_connector_extra_config is not read" in line
    assert "chunk_tokens (use INFERA_KVD_CHUNK_TOKENS)" in line and "socket (use INFERA_KVD_SOCKET)" in line
    assert "foo" in line


def test_a_fail_policy_is_still_said(caplog: pytest.LogCaptureFixture) -> None:
    (line,) = _start(caplog, failure_policy="fail")
    assert "kv_load_failure_policy is 'fail'" in line
