"""Everything `kvd launch` writes passes `kvd lint`, and reads back as the same deployment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launchkit import VARIANTS, kvd

from infera.launch.lint import Source, read_source
from infera.launch.render import FORMATS


def _files(tmp: Path, args: list[str], fmt: str) -> list[Path]:
    out = tmp / fmt
    res = kvd("launch", *args, "--image", "img:1", "--format", fmt, "--out", str(out))
    assert res.code == 0, res.stderr
    return sorted(out.iterdir())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_emitted_files_lint_clean(tmp_path: Path, variant: str, fmt: str) -> None:
    files = _files(tmp_path, VARIANTS[variant], fmt)
    res = kvd("lint", "--format", "json", "--together", *map(str, files))
    assert res.code == 0
    assert json.loads(res.stdout)["findings"] == []
    for f in files:  # and each file on its own (one systemd unit, one env file)
        res = kvd("lint", "--format", "json", str(f))
        assert json.loads(res.stdout)["findings"] == [], f.name


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "env"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_emitted_files_read_back_as_the_same_deployment(tmp_path: Path, variant: str, fmt: str) -> None:
    want = json.loads(kvd("launch", *VARIANTS[variant], "--image", "img:1", "--format", "json").stdout)
    files = _files(tmp_path, VARIANTS[variant], fmt)
    daemons, legs, routers = [], [], []
    for f in files:
        dep, errors = read_source(Source(str(f), f.read_text()))
        assert errors == []
        daemons += dep.daemons
        legs += dep.legs
        routers += dep.routers
    assert [r.argv for r in routers] == [r["argv"] for r in want.get("routers", [])]
    assert [(d.argv, d.env) for d in daemons] == [(want["daemon"]["argv"], want["daemon"]["env"])]
    got = sorted(json.dumps([leg.argv, leg.env, leg.role, leg.ktc()]) for leg in legs)
    assert got == sorted(
        json.dumps([w["argv"], w["env"], w["role"], w["kv_transfer_config"]]) for w in want["legs"]
    )


def test_env_files_hold_each_legs_environment(tmp_path: Path) -> None:
    want = json.loads(kvd("launch", *VARIANTS["pd-ais-prewarm"], "--format", "json").stdout)
    files = {f.name: f for f in _files(tmp_path, VARIANTS["pd-ais-prewarm"], "env")}
    assert sorted(files) == ["decode.env", "prefill.env"]
    for leg in want["legs"]:
        dep, _ = read_source(
            Source(str(files[leg["name"] + ".env"]), files[leg["name"] + ".env"].read_text())
        )
        assert dep.legs[0].env == leg["env"]


def test_hash_seed_none_is_only_a_warning(tmp_path: Path) -> None:
    files = _files(
        tmp_path,
        ["pd", "--model", "m", "--etcd", "e:2379", "--advertise-host", "10.0.0.5", "--hash-seed", "none"],
        "shell",
    )
    res = kvd("lint", "--format", "json", str(files[0]))
    findings = json.loads(res.stdout)["findings"]
    assert res.code == 0 and {(f["code"], f["severity"]) for f in findings} == {("KVD301", "warning")}
    res = kvd("lint", "--format", "json", "--vllm-version", "0.29", str(files[0]))
    assert json.loads(res.stdout)["findings"] == []


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", ["single-disk-ais-prewarm", "pd-ais-prewarm"])
def test_emitted_text_piped_to_lint_is_clean(variant: str, fmt: str) -> None:
    """`kvd launch ... --emit | kvd lint -`: several files joined by --emit are read part by part."""
    text = kvd("launch", *VARIANTS[variant], "--image", "img:1", "--format", fmt).stdout
    res = kvd("lint", "--format", "json", "-", stdin=text)
    assert res.code == 0 and json.loads(res.stdout)["findings"] == []
    seed = {
        "shell": "PYTHONHASHSEED=0",
        "systemd": "PYTHONHASHSEED=0",
        "json": '"PYTHONHASHSEED": "0"',
        "k8s": "value: '0'",
        "compose": "PYTHONHASHSEED: '0'",
    }
    if variant.startswith("pd") and fmt in seed:  # change the first leg's seed: the legs now disagree
        broken = text.replace(seed[fmt], seed[fmt].replace("0", "1"), 1)
        findings = json.loads(kvd("lint", "--format", "json", "-", stdin=broken).stdout)["findings"]
        assert {f["code"] for f in findings} == {"KVD301"}, findings
