"""The prewarm route's checks of a client's prompt, without vLLM (tests/vllm/test_server.py runs
the same cases against a real server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from infera.engine.vllm.api.prewarm import PrewarmError, check_prompt, prewarm, prompt_limits


class FakeModelConfig:
    model = "/m/tiny"
    max_model_len = 4096

    def get_vocab_size(self) -> int:
        return 32000


CONFIG = SimpleNamespace(model_config=FakeModelConfig())


@pytest.mark.parametrize(
    ("ids", "code", "message"),
    [
        (
            [1, 999999],
            "invalid_token",
            "token id 999999 at position 1 is outside the vocabulary (size 32000)",
        ),
        ([32000], "invalid_token", "token id 32000 at position 0 is outside the vocabulary (size 32000)"),
        ([5, -1], "invalid_token", "token id -1 at position 1 is negative"),
        ([1] * 70000, "prompt_too_long", "prompt of 70000 tokens exceeds max_model_len 4096"),
        ([], "empty_prompt", "the prompt is empty"),
        ([1, "x"], "bad_request", "token id at position 1 is not an integer: 'x'"),
        ([1, 2.0], "bad_request", "token id at position 1 is not an integer: 2.0"),
        ([True], "bad_request", "token id at position 0 is not an integer: True"),
        ([None], "bad_request", "token id at position 0 is not an integer: None"),
        ([[1, 2]], "bad_request", "token id at position 0 is not an integer: a list"),
        ([10**400], "invalid_token", "token id a 1329-bit integer at position 0 is outside the vocabulary"),
        (["y" * 100_000], "bad_request", "... (100000 characters)"),
        ({"a": 1}, "bad_request", '"prompt" must be a string or a list of token ids'),
    ],
)
def test_check_prompt_says_what_is_wrong(ids: Any, code: str, message: str) -> None:
    with pytest.raises(PrewarmError) as err:
        check_prompt(ids, 32000, 4096)
    assert err.value.status == 400
    assert err.value.code == code
    assert message in err.value.message
    assert len(err.value.message) < 200


def test_check_prompt_accepts_the_edges() -> None:
    assert check_prompt([0, 31999], 32000, 4096) == [0, 31999]
    assert check_prompt([7] * 4096, 32000, 4096) == [7] * 4096, "max_model_len itself fits (as in vLLM)"
    assert check_prompt([10**6], None, None) == [10**6], "an unknown bound is not checked"


def test_prompt_limits_reads_the_model_config() -> None:
    assert prompt_limits(CONFIG) == (32000, 4096)
    assert prompt_limits(CONFIG, SimpleNamespace(max_token_id=32100)) == (32101, 4096), "as vLLM: the larger"
    assert prompt_limits(SimpleNamespace()) == (None, None)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"prompt": [999999]}, "invalid_token"),
        ({"prompt": [-3]}, "invalid_token"),
        ({"prompt": [1] * 70000}, "prompt_too_long"),
        ({"prompt": []}, "empty_prompt"),
        ({"prompt": ""}, "empty_prompt"),
        ({"prompt": [1, "x"]}, "bad_request"),
    ],
)
def test_prewarm_refuses_bad_prompts_before_deriving_keys(body: Any, code: str) -> None:
    """No key derivation, no daemon: the socket does not exist and vLLM is not installed here."""
    with pytest.raises(PrewarmError) as err:
        prewarm("/nonexistent/kvd.sock", CONFIG, body)
    assert (err.value.status, err.value.code) == (400, code)


def test_text_prompt_length_is_checked_after_tokenizing() -> None:
    tokenizer = SimpleNamespace(encode=lambda text: [1] * (len(text) + 1), max_token_id=31999)
    with pytest.raises(PrewarmError) as err:
        prewarm("/nonexistent/kvd.sock", CONFIG, {"prompt": "x" * 5000}, tokenizer)
    assert err.value.code == "prompt_too_long"
    assert "prompt of 5001 tokens exceeds max_model_len 4096" in err.value.message
