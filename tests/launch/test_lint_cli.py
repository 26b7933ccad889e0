"""`kvd lint` as a command: output formats, exit codes, stdin, suppressions, rule listing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launchkit import kvd

from infera.launch.rules import REGISTRY

CORPUS = Path(__file__).resolve().parent / "corpus"
SEED = str(CORPUS / "kvd301-seed-one-leg.sh")  # one error
CHUNKS = str(CORPUS / "kvd303-small-chunks.env")  # one warning
CLEAN = str(CORPUS / "tricky-quoting.sh")


def test_text_output_is_file_line_col_rule_message_then_fix() -> None:
    res = kvd("lint", SEED)
    assert res.code == 1
    first, fix = res.stdout.splitlines()[:2]
    assert first.startswith(f"{SEED}:10:1 KVD301 [error] PYTHONHASHSEED is unset on leg")
    assert fix == f"  fix: {REGISTRY['KVD301'].fix}"
    assert res.stdout.splitlines()[-1] == "kvd lint: 1 file checked, 1 error, 0 warnings"


def test_exit_status_is_zero_with_warnings_only() -> None:
    res = kvd("lint", CHUNKS, CLEAN)
    assert res.code == 0
    assert "KVD303 [warning]" in res.stdout
    assert res.stdout.splitlines()[-1] == "kvd lint: 2 files checked, 0 errors, 1 warning"


def test_clean_file() -> None:
    res = kvd("lint", CLEAN)
    assert (res.code, res.stdout) == (0, "kvd lint: 1 file checked, no problems\n")


def test_json_output() -> None:
    res = kvd("lint", "--format", "json", SEED, CHUNKS)
    data = json.loads(res.stdout)
    assert data["summary"] == {"files": 2, "errors": 1, "warnings": 1, "suppressed": 0}
    f = next(x for x in data["findings"] if x["code"] == "KVD303")
    assert {k: f[k] for k in ("code", "name", "severity", "filename", "line", "column")} == {
        "code": "KVD303",
        "name": "chunk-tokens-fixed",
        "severity": "warning",
        "filename": CHUNKS,
        "line": 6,
        "column": 1,
    }
    assert f["fix"] == REGISTRY["KVD303"].fix and f["docs"] == "docs/rules/KVD303.md"
    assert kvd("lint", "--json", SEED).stdout == kvd("lint", "--format", "json", SEED).stdout


def test_sarif_output() -> None:
    res = kvd("lint", "--format", "sarif", SEED)
    doc = json.loads(res.stdout)
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert sorted(ids) == sorted(REGISTRY)
    (result,) = run["results"]
    assert result["ruleId"] == "KVD301" and result["level"] == "error"
    assert ids[result["ruleIndex"]] == "KVD301"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 10, "startColumn": 1}
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == SEED


def test_github_output_escapes_properties() -> None:
    res = kvd(
        "lint", "--format", "github", "--stdin-filename", "deploy/a,b:c.sh", "-", stdin=Path(SEED).read_text()
    )
    line = res.stdout.strip()
    assert line.startswith("::error file=deploy/a%2Cb%3Ac.sh,line=10,col=1,title=KVD301 hash-seed-mismatch::")
    assert "Fix: Set PYTHONHASHSEED=0" in line
    assert res.code == 1


def test_stdin_type_is_detected_from_content() -> None:
    text = (CORPUS / "tricky-k8s-env.yaml").read_text()
    res = kvd("lint", "--format", "json", "-", stdin=text)
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["KVD301"]
    assert json.loads(res.stdout)["findings"][0]["filename"] == "-"


def test_type_option_forces_the_parser() -> None:
    text = "PYTHONHASHSEED=0\nINFERA_KVD_AIS=sometimes\n"
    res = kvd("lint", "--format", "json", "--type", "env", "-", stdin=text)
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["KVD408"]


def test_suppression_comment_on_the_line_and_above(tmp_path: Path) -> None:
    base = (CORPUS / "kvd303-small-chunks.env").read_text()
    line = "INFERA_KVD_CHUNK_TOKENS=64"
    cases = {
        # env files have no trailing comments (docker and systemd keep them in the value): use a script
        "same-line.sh": " ".join(ln for ln in base.splitlines() if not ln.startswith("#"))
        + " python -m infera.engine.vllm --model m --enable-prefix-caching --kv-transfer-config "
        + """'{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'"""
        + "  # kvd: ignore[KVD303]\n",
        "above.env": base.replace(line, "# kvd: ignore[chunk-tokens-fixed]\n" + line),
        "other-rule.env": base.replace(line, "# kvd: ignore[KVD301]\n" + line),
        "whole-file.env": "# kvd: ignore-file[KVD303]\n" + base,
    }
    expect = {"same-line.sh": 0, "above.env": 0, "other-rule.env": 1, "whole-file.env": 0}
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        data = json.loads(kvd("lint", "--json", str(path)).stdout)
        assert [f["code"] for f in data["findings"]] == ["KVD303"] * expect[name], name
        assert data["summary"]["suppressed"] == 1 - expect[name], name


def test_suppression_covers_every_line_of_a_multi_line_command(tmp_path: Path) -> None:
    text = Path(SEED).read_text().replace("VLLM_HOST_IP=10.0.0.6 \\", "VLLM_HOST_IP=10.0.0.6 \\")
    lines = text.splitlines()
    last = max(i for i, ln in enumerate(lines) if "kv_consumer" in ln)
    lines[last] += "  # kvd: ignore[KVD301]"
    path = tmp_path / "s.sh"
    path.write_text("\n".join(lines) + "\n")
    assert kvd("lint", str(path)).code == 0


def test_list_rules() -> None:
    res = kvd("lint", "--list-rules")
    assert res.code == 0
    assert [ln.split()[0] for ln in res.stdout.splitlines()] == sorted(REGISTRY)
    data = json.loads(kvd("lint", "--list-rules", "--json").stdout)
    assert [r["code"] for r in data] == sorted(REGISTRY)
    assert {"code", "name", "severity", "summary", "fix", "docs"} <= set(data[0])


def test_explain_prints_the_docs_page() -> None:
    res = kvd("lint", "--explain", "pd-prefill-role")
    assert res.code == 0
    assert res.stdout.startswith("# KVD201 pd-prefill-role (error)")
    assert "## Why it matters" in res.stdout and "## Fix" in res.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "no files to check"),
        (["/nonexistent/deploy.sh"], "cannot read /nonexistent/deploy.sh"),
        (["--format", "xml", CLEAN], "--format: 'xml'"),
        (["--type", "toml", CLEAN], "--type: 'toml'"),
        (["--select", "KVD999", CLEAN], "--select: unknown rule 'KVD999'"),
        (["--ignore", "no-such-rule", CLEAN], "--ignore: unknown rule 'no-such-rule'"),
        (["--vllm-version", "latest", CLEAN], "--vllm-version: 'latest'"),
        (["--explain", "KVD999"], "--explain: unknown rule"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], needle: str) -> None:
    res = kvd("lint", *args)
    assert res.code == 2
    assert res.stderr.splitlines()[0].startswith("error: ") and needle in res.stderr.splitlines()[0]
    assert "Traceback" not in res.stderr


def test_vllm_flag_without_vllm_is_a_usage_error() -> None:
    from infera.launch.ktc import vllm_available

    if vllm_available():
        pytest.skip("vLLM is importable here; tests/vllm covers --vllm")
    res = kvd("lint", "--vllm", CLEAN)
    assert res.code == 2 and "vLLM is not importable" in res.stderr


def test_kvd_help_does_not_import_the_launch_machinery() -> None:
    import subprocess
    import sys

    code = "import sys, infera.cli; print(sorted(m for m in sys.modules if m.startswith('infera.launch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['infera.launch', 'infera.launch.cli', 'infera.launch.emit']"  # emit: Output only


def test_a_directory_means_the_lintable_files_under_it() -> None:
    res = kvd("lint", "--json", str(CORPUS))
    data = json.loads(res.stdout)
    files = [
        p
        for p in CORPUS.rglob("*")
        if p.is_file() and p.suffix in (".sh", ".service", ".env", ".yaml", ".json")
    ]
    assert data["summary"]["files"] == len(
        files
    )  # expected.yaml too: YAML that is no deployment has no findings
    assert res.code == 1
