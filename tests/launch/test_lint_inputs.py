"""What `kvd lint` makes of inputs that hold nothing to check, or that systemd would not read as written:
a directory with no lintable file, a binary or empty file, and unit-file syntax (KVD000)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from launchkit import kvd
from typer.testing import CliRunner

from infera.launch.lint.unitcheck import check_unit

BINARY = bytes(range(256)) * 4  # not UTF-8 from byte 128 on
ENGINE_UNIT = """\
[Unit]
Description=vLLM engine
After=network-online.target

[Service]
Type=simple
Environment=PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/run/kvd.sock
ExecStart=/usr/bin/python3 -m infera.engine.vllm --model m --enable-prefix-caching \\
  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def findings(*args: str) -> tuple[int, list[dict[str, Any]]]:
    res = kvd("lint", "--json", *args)
    return res.code, json.loads(res.stdout)["findings"]


def brief(found: list[dict[str, Any]]) -> list[tuple[str, int, str, str]]:
    return [(f["code"], f["line"], f["severity"], f["message"]) for f in found]


# --- a directory with nothing to lint ----------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [{}, {"kvd.service.j2": "[Unit]\n", ".hidden.sh": "echo\n", "sub/README": "x"}],
    ids=["empty", "templates-and-hidden"],
)
def test_a_directory_with_nothing_lintable_is_a_usage_error(content: dict[str, str], tmp_path: Path) -> None:
    for name, text in content.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    res = kvd("lint", str(tmp_path))
    assert res.code == 2 and res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert line == (
        f"error: nothing lintable under {tmp_path}: no *.sh *.bash *.service *.env *.yaml *.yml *.json files "
        "(hidden ones skipped)"
    )


def test_an_empty_directory_next_to_a_file_is_still_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "ok.service").write_text(ENGINE_UNIT)
    res = kvd("lint", str(tmp_path / "ok.service"), str(tmp_path / "empty"))
    assert res.code == 2 and "nothing lintable under" in res.stderr


# --- binary and empty files --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["deploy.sh", "kvd.service", "blob", "spec.json", "k8s.yaml", "engine.env"])
@pytest.mark.parametrize(
    ("data", "why"),
    [(BINARY, "byte 128 is not UTF-8"), (b"PYTHONHASHSEED=0\0\n", "byte 16 is NUL")],
    ids=["not-utf8", "nul"],
)
def test_a_binary_file_is_one_not_a_text_file_finding(
    name: str, data: bytes, why: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    code, found = findings(str(path))
    assert code == 1
    assert brief(found) == [
        (
            "KVD000",
            1,
            "error",
            f"not a text file ({why}): kvd lint reads UTF-8 scripts, units, env files, YAML and JSON",
        )
    ]


@pytest.mark.parametrize("name", ["spec.json", "k8s.yaml", "kvd.service"])
@pytest.mark.parametrize("text", ["", "\n  \n"], ids=["empty", "blank"])
def test_an_empty_file_is_one_empty_file_finding(name: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, found = findings(str(path))
    assert code == 1 and brief(found) == [("KVD000", 1, "error", "empty file: nothing to check")]
    assert "wrong path" in found[0]["fix"]


@pytest.mark.parametrize("name", ["deploy.sh", "engine.env"])
def test_an_empty_script_or_env_file_is_valid(name: str, tmp_path: Path) -> None:
    """An empty env file (a placeholder an env loader reads) or script runs fine: no finding."""
    path = tmp_path / name
    path.write_text("")
    assert findings(str(path)) == (0, [])


@pytest.mark.parametrize(
    ("data", "message"), [(BINARY, "not a text file"), (b"", "empty file")], ids=["binary", "empty"]
)
def test_stdin_that_is_binary_or_empty(data: bytes, message: str) -> None:
    from infera.cli import app

    res = CliRunner().invoke(app, ["lint", "--json", "-"], input=data)
    (finding,) = json.loads(res.stdout)["findings"]
    assert res.exit_code == 1 and finding["message"].startswith(message)


# --- systemd unit syntax -----------------------------------------------------------------------


def test_a_well_formed_unit_has_no_syntax_findings() -> None:
    assert check_unit(ENGINE_UNIT, "engine.service") == []


def test_broken_unit_syntax_is_reported_where_systemd_would_complain(tmp_path: Path) -> None:
    unit = tmp_path / "engine.service"
    unit.write_text(
        ENGINE_UNIT.replace("[Unit]", "[Unit")
        .replace("After=network-online.target", "After network-online.target")
        .replace("[Install]", "[Instal]")
        .replace("Restart=on-failure", "ExecStrat=/bin/true\nrestart=on-failure")
    )
    code, found = findings(str(unit))
    assert code == 1
    assert brief(found) == [
        ("KVD000", 1, "error", "section header '[Unit' has no closing ']': systemd refuses the file"),
        ("KVD000", 3, "error", "line has no '=': systemd expects Key=value and ignores it"),
        (
            "KVD000",
            10,
            "warning",
            "unknown key ExecStrat= in [Service] (did you mean ExecStart=?): systemd ignores it",
        ),
        (
            "KVD000",
            11,
            "warning",
            "unknown key restart= in [Service] (keys are case-sensitive: Restart=): systemd ignores it",
        ),
        (
            "KVD000",
            13,
            "error",
            "unknown section [Instal] (did you mean [Install]?): systemd ignores it and every key in it",
        ),
    ]


def test_a_misspelt_exec_start_leaves_a_service_that_systemd_refuses(tmp_path: Path) -> None:
    unit = tmp_path / "engine.service"
    unit.write_text(ENGINE_UNIT.replace("ExecStart=", "ExecStrat="))
    code, found = findings(str(unit))
    assert code == 1
    assert brief(found) == [
        ("KVD000", 5, "error", "no ExecStart= in [Service]: systemd refuses to start this service"),
        (
            "KVD000",
            8,
            "warning",
            "unknown key ExecStrat= in [Service] (did you mean ExecStart=?): systemd ignores it",
        ),
    ]


def test_an_unknown_service_section_loses_the_whole_service(tmp_path: Path) -> None:
    unit = tmp_path / "engine.service"
    unit.write_text(ENGINE_UNIT.replace("[Service]", "[Servce]"))
    code, found = findings(str(unit))
    assert code == 1
    assert [(f["line"], f["severity"]) for f in found] == [(1, "error"), (5, "error")]
    assert found[1]["message"].startswith("unknown section [Servce] (did you mean [Service]?)")
    assert found[0]["message"].startswith("no ExecStart= in [Service]")


def test_valid_keys_lint_does_not_list_and_drop_ins_are_left_alone() -> None:
    extra = (
        "[Unit]\nConditionPathExists=/dev/kfd\nAssertHost=gpu1\nBindTo=a.service\nX-Owner=ml\n"
        "[Service]\nExecStart=/bin/true\nRootImage=/img.raw\nProtectProc=invisible\nLogRateLimitIntervalSec=5\n"
        "CoredumpFilter=default\nIPAccounting=yes\nX-Team=infra\n[X-Custom]\nAnything=goes\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    assert check_unit(extra, "engine.service") == []
    drop_in = "[Service]\nEnvironment=INFERA_KVD_SOCKET=/run/kvd.sock\n"
    assert check_unit(drop_in, "override.conf") == []


def test_assignments_before_the_first_section_are_a_warning() -> None:
    (problem,) = check_unit("Description=early\n" + ENGINE_UNIT, "engine.service")
    assert (problem.line, problem.error) == (1, False)
    assert problem.message == "Description= comes before the first [Section]: systemd ignores it"
