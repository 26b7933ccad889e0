"""KVD301 reads PYTHONHASHSEED the way CPython does, and compares values the way vLLM does (as text).

CPython: empty or ``random`` is a random seed; otherwise ``strtoul`` in base 10 over the whole text
(leading whitespace, one sign, digits, nothing after) up to 4294967295. The parity test runs the real
interpreter on every value, so the rule cannot drift from what Python does.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from launchkit import kvd

from infera.keyrules import python_hash_seed

KTC = '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
ENGINE = f"python -m infera.engine.vllm --model m --enable-prefix-caching --kv-transfer-config '{KTC}'"

STARTS = ["", " 0", "+5", "007", "-0", "-00", "\t5", "\n5", "\x0b5", "\x0c5", "\r5", "random", "4294967295"]
REFUSED = {
    "0 ": "has ' ' after the number",
    "0x10": "has 'x10' after the number",
    "1_000": "has '_000' after the number",
    "-1": "is negative",
    "4294967296": "is above 4294967295",
    "99999999999999999999999": "is above 4294967295",
    " ": "is neither 'random' nor a decimal number",
    "+": "is neither 'random' nor a decimal number",
    "+-5": "is neither 'random' nor a decimal number",
    " random": "is neither 'random' (it is lower-case and exact) nor a decimal number",
    "RANDOM": "is neither 'random' (it is lower-case and exact) nor a decimal number",
    "٣": "is neither 'random' nor a decimal number",
}


def _python(seed: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env["PYTHONHASHSEED"] = seed
    return subprocess.run(
        [sys.executable, "-S", "-c", "import sys; print(sys.flags.hash_randomization, hash('kvd'))"],
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_rule_reads_the_variable_exactly_as_cpython_does() -> None:
    for value in [*STARTS, *REFUSED]:
        run = _python(value)
        try:
            seed = python_hash_seed(value)
        except ValueError:
            assert run.returncode != 0 and "PYTHONHASHSEED" in run.stderr, repr(value)
            continue
        assert run.returncode == 0, (repr(value), run.stderr)
        if seed is not None:  # the same seed as its plain decimal form
            assert run.stdout == _python(str(seed)).stdout, repr(value)


@pytest.mark.parametrize("value", STARTS, ids=repr)
def test_a_value_python_starts_with_is_not_reported(value: str, tmp_path: Path) -> None:
    script = tmp_path / "e.sh"
    script.write_text(f"#!/bin/sh\nPYTHONHASHSEED={shlex.quote(value)} {ENGINE}\n")
    data = json.loads(kvd("lint", "--json", "--select", "KVD301", str(script)).stdout)
    assert data["findings"] == []


@pytest.mark.parametrize(("value", "reason"), REFUSED.items(), ids=repr)
def test_a_value_python_refuses_is_an_error_with_its_reason(value: str, reason: str, tmp_path: Path) -> None:
    script = tmp_path / "e.sh"
    script.write_text(f"#!/bin/sh\nPYTHONHASHSEED={shlex.quote(value)} {ENGINE}\n")
    res = kvd("lint", "--json", "--select", "KVD301", str(script))
    (finding,) = json.loads(res.stdout)["findings"]
    assert finding["severity"] == "error" and res.code == 1
    assert finding["message"] == (
        f"PYTHONHASHSEED={value!r} on leg 'e.sh:2' {reason}: Python refuses to start "
        "(it takes 'random' or a decimal integer in [0, 4294967295])"
    )


def _pod(prefill_env: str, decode_env: str) -> str:
    def container(name: str, env: str) -> str:
        return (
            f"  - name: {name}\n    image: vllm\n"
            f"    command: [python, -m, infera.engine.vllm, --model, m, --enable-prefix-caching, "
            f"--kv-transfer-config, '{KTC}']\n    env:\n{env}"
        )

    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: infera}\nspec:\n  containers:\n"
        + container("prefill", prefill_env)
        + container("decode", decode_env)
    )


def test_a_k8s_entry_without_value_is_an_empty_seed_quoted_in_the_mismatch(tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        _pod("    - name: PYTHONHASHSEED\n", "    - name: PYTHONHASHSEED\n      value: '0'\n")
    )
    (finding,) = json.loads(kvd("lint", "--json", "--select", "KVD301", str(manifest)).stdout)["findings"]
    assert finding["message"].startswith(
        "PYTHONHASHSEED='0' on leg 'infera/decode' but '' on 'infera/prefill': the legs compute"
    )


def test_empty_against_unset_says_vllm_counts_empty_as_set(tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(_pod("    - name: PYTHONHASHSEED\n", "    - name: OTHER\n      value: x\n"))
    (finding,) = json.loads(kvd("lint", "--json", "--select", "KVD301", str(manifest)).stdout)["findings"]
    assert finding["message"].startswith(
        "PYTHONHASHSEED is unset on leg 'infera/decode' but '' on 'infera/prefill' "
        "(vLLM counts an empty value as set): "
    )


def test_texts_that_are_one_seed_to_python_still_differ_for_vllm(tmp_path: Path) -> None:
    script = tmp_path / "pd.sh"
    script.write_text(f"#!/bin/sh\nPYTHONHASHSEED=+0 {ENGINE}\nPYTHONHASHSEED=0 {ENGINE}\n")
    (finding,) = json.loads(kvd("lint", "--json", "--select", "KVD301", str(script)).stdout)["findings"]
    assert finding["message"].startswith(
        "PYTHONHASHSEED='0' on leg 'pd.sh:3' but '+0' on 'pd.sh:2' (both are seed 0 to Python, "
        "but vLLM seeds its block hashes from the text): "
    )
