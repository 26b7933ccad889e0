"""One docs page per rule, generated from the rule's docstring and kept in sync."""

from __future__ import annotations

from pathlib import Path

from infera.launch.docgen import pages
from infera.launch.rules import REGISTRY, all_rules

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"


def test_every_rule_has_its_page_and_the_pages_are_current() -> None:
    for name, text in pages().items():
        path = DOCS / name
        assert path.exists(), f"{path} missing: run python -m infera.launch.docgen"
        assert path.read_text() == text, f"{path} is stale: run python -m infera.launch.docgen"
    extra = {p.name for p in DOCS.glob("*.md")} - set(pages())
    assert extra == set()


def test_every_page_says_what_why_example_fix() -> None:
    for r in all_rules():
        for heading in ("## What it does", "## Why it matters", "## Example", "## Fix"):
            assert heading in r.doc, (r.code, heading)
        assert r.fix and r.summary and r.name == r.name.lower()


def test_codes_and_names_are_unique() -> None:
    assert len({r.name for r in REGISTRY.values()}) == len(REGISTRY)
