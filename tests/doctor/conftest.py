"""Doctor test fixtures: ``hosts`` builds doctor contexts over fixture host trees (see hostkit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostkit import FixtureHost


@pytest.fixture
def hosts(fp: Any, tmp_path: Path) -> FixtureHost:
    return FixtureHost(fp, tmp_path)
