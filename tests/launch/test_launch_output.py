"""`--out` and `--save-spec` never replace a file silently; the docs' examples name files that exist."""

from __future__ import annotations

import re
from pathlib import Path

from launchkit import kvd

SINGLE = ["single", "--model", "m"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "launch.md"


def test_out_refuses_to_replace_a_file_that_holds_something_else(tmp_path: Path) -> None:
    out = tmp_path / "units"
    assert kvd("launch", *SINGLE, "--format", "systemd", "--out", str(out)).code == 0
    unit = out / "infera-kvd.service"
    unit.write_text("# edited by hand\n")
    res = kvd("launch", *SINGLE, "--format", "systemd", "--out", str(out))
    assert res.code == 2 and res.stderr == (
        f"error: --out: {unit} already exists with other content; pass --force to replace it\n"
    )
    assert unit.read_text() == "# edited by hand\n"
    res = kvd("launch", *SINGLE, "--format", "systemd", "--out", str(out), "--force")
    assert res.code == 0 and f"wrote {unit}" in res.stderr and "ExecStart=" in unit.read_text()


def test_nothing_is_written_unless_every_file_can_be(tmp_path: Path) -> None:
    out = tmp_path / "units"
    out.mkdir()
    (out / "infera-engine.service").write_text("mine\n")
    res = kvd(
        "launch", *SINGLE, "--format", "systemd", "--out", str(out), "--save-spec", str(tmp_path / "s.yaml")
    )
    assert res.code == 2 and "infera-engine.service already exists" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["infera-engine.service"]
    assert not (tmp_path / "s.yaml").exists()


def test_writing_the_same_files_again_is_fine(tmp_path: Path) -> None:
    out, spec = tmp_path / "sh", tmp_path / "deploy.yaml"
    args = [*SINGLE, "--out", str(out), "--save-spec", str(spec)]
    assert kvd("launch", *args).code == 0
    res = kvd("launch", *args)
    assert (
        res.code == 0 and f"unchanged {out / 'launch.sh'}" in res.stderr and f"unchanged {spec}" in res.stderr
    )
    assert (out / "launch.sh").stat().st_mode & 0o111
    # saving a loaded spec over itself, as docs/launch.md says, gives the same file
    assert kvd("launch", "--spec", str(spec), "--save-spec", str(spec)).code == 0


def test_save_spec_refuses_to_replace_another_spec(tmp_path: Path) -> None:
    spec = tmp_path / "deploy.yaml"
    assert kvd("launch", *SINGLE, "--save-spec", str(spec)).code == 0
    res = kvd("launch", "single", "--model", "m2", "--save-spec", str(spec))
    assert res.code == 2 and res.stderr.startswith(
        f"error: --save-spec: {spec} already exists with other content"
    )
    assert "--force" in res.stderr.splitlines()[0] and "m2" not in spec.read_text()
    assert kvd("launch", "single", "--model", "m2", "--save-spec", str(spec), "--force").code == 0
    assert "m2" in spec.read_text()


def test_out_that_is_a_file_is_not_a_directory(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = kvd("launch", *SINGLE, "--out", str(afile))
    assert res.code == 2 and res.stderr == f"error: --out: {afile} is not a directory\n"


def test_the_docs_examples_name_spec_files_that_exist_or_are_saved_first() -> None:
    text = DOCS.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    examples = [b for b in blocks if "kvd launch" in b]
    assert examples
    for block in examples:
        saved: set[str] = set()
        for cmd in block.replace("\\\n", " ").splitlines():
            saved.update(re.findall(r"--save-spec\s+(\S+)", cmd))
            for path in re.findall(r"--spec\s+(\S+)", cmd):
                exists = (DOCS.parents[1] / path).exists()
                assert path in saved or exists, f"docs/launch.md runs --spec {path}, which nothing makes"
