"""The bad-config corpus: each file with the findings `kvd lint` must report (tests/launch/corpus/expected.yaml)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchkit import kvd

from infera.launch.rules import REGISTRY

CORPUS = Path(__file__).resolve().parent / "corpus"
CASES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "expected.yaml").read_text())


def _case_id(case: dict[str, Any]) -> str:
    files = case.get("files") or [case["file"]]
    return "+".join(files) + ("[" + " ".join(case.get("args", [])) + "]" if case.get("args") else "")


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_corpus_file_gives_expected_findings(case: dict[str, Any]) -> None:
    files = [str(CORPUS / f) for f in (case.get("files") or [case["file"]])]
    res = kvd("lint", "--format", "json", *case.get("args", []), *files)
    data = json.loads(res.stdout)
    got = Counter(f"{f['code']}:{f['line']}:{f['severity']}" for f in data["findings"])
    assert got == Counter(case["expect"]), res.stdout
    assert res.code == (1 if any(e.endswith(":error") for e in case["expect"]) else 0)


def test_every_rule_has_a_corpus_file_that_triggers_it() -> None:
    for code in REGISTRY:
        named = [c for c in CASES if (c.get("file") or "").lower().startswith(code.lower())]
        assert named, f"no corpus file for {code}"
        assert any(any(e.startswith(code + ":") for e in c["expect"]) for c in named), code


def test_every_corpus_file_has_a_case() -> None:
    covered = {f for c in CASES for f in (c.get("files") or [c["file"]])}
    files = {
        str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file() and p.name != "expected.yaml"
    }
    assert files - covered == set()
    assert covered - files == set()
