"""Every check has its docs page, with the three sections users look for, and the overview lists it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infera.doctor.registry import all_checks

DOCS = Path(__file__).resolve().parents[2] / "docs" / "doctor"
IDS = [s.id for s in all_checks()]


@pytest.mark.parametrize("check_id", IDS)
def test_each_check_has_a_docs_page(check_id):
    text = (DOCS / f"{check_id}.md").read_text()
    assert text.startswith(f"# {check_id}:")
    for section in ("## What it reads", "## Why it matters", "## How to fix"):
        assert section in text, f"{check_id}.md lacks {section!r}"


def test_overview_lists_every_check_and_no_stale_pages():
    overview = (DOCS / "README.md").read_text()
    for check_id in IDS:
        assert f"[{check_id}]({check_id}.md)" in overview
    pages = {p.stem for p in DOCS.glob("*.md")} - {"README"}
    assert pages == set(IDS)
