"""What `kvd launch` writes, checked by the real tools that will read it, for every format.

* systemd units: ``systemd-analyze verify`` (Debian's ``systemd``): syntax, dependencies, and that
  each ``ExecStart=`` runs an executable that exists (the interpreter must be an absolute path);
* Kubernetes manifests: the API schemas of Kubernetes :data:`K8S_VERSIONS`, strict (no unknown
  field), through ``kubernetes-validate`` (PyPI; it ships the schemas, so nothing is downloaded);
* compose files: ``docker compose config`` (the plugin) or ``docker-compose config`` (Debian's 1.29),
  both offline;
* shell scripts and env files: ``shellcheck`` and ``bash -n`` (env files as POSIX sh, since they are
  meant to be sourced);
* json: a spec that ``kvd launch --spec`` reads back to the same deployment.

Every variant of :data:`launchkit.VARIANTS` (single-host and P/D, disk, AIS, distributed tiers,
awkward quoting) in every format. Each tool also gets one broken file first, so a validator that
checks nothing cannot pass. ``scripts/setup.sh --all`` installs the tools; a missing one is a skip,
and a failure where ``KVD_TEST_REQUIRE_TOOLS=1`` (``scripts/test.sh``, so CI never skips them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from launchkit import VARIANTS, kvd

K8S_VERSIONS = ("1.33.0", "1.37.0")
REQUIRE = os.environ.get("KVD_TEST_REQUIRE_TOOLS") == "1"


def _missing(what: str) -> None:
    message = f"{what} is not installed (scripts/setup.sh --all installs it)"
    if REQUIRE:
        pytest.fail(message)
    pytest.skip(message)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        _missing(name)
    assert path is not None
    return path


@cache
def _compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Debian's docker-compose is a Python program of the system's Python: keep ours out of its path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def _emit(tmp: Path, variant: str, fmt: str) -> list[Path]:
    """``kvd launch VARIANT --format FMT --out DIR``: the files, with an interpreter that exists here."""
    args = list(VARIANTS[variant])
    if "--python" in args:  # the awkward path (a space in it) as a real file, for systemd-analyze
        i = args.index("--python") + 1
        fake = tmp / "my venv" / "bin" / "python"
        fake.parent.mkdir(parents=True, exist_ok=True)
        if not fake.exists():
            fake.symlink_to(sys.executable)
        args[i] = str(fake)
    if fmt in ("k8s", "compose"):
        args += ["--image", "ghcr.io/example/infera-kvd:0.1"]
    out = tmp / f"{variant}.{fmt}"
    res = kvd("launch", *args, "--format", fmt, "--out", str(out))
    assert res.code == 0, res.stderr
    assert "warning" not in res.stderr, res.stderr
    return sorted(out.iterdir())


# -- the checks, one per tool ---------------------------------------------------------------------


def systemd_verify(units: list[Path]) -> str:
    """Problems ``systemd-analyze verify`` finds in ``units`` (checked together: engines Require kvd)."""
    tool = _tool("systemd-analyze")
    res = _run([tool, "verify", "--man=no", *[f"./{u.name}" for u in units]], cwd=units[0].parent)
    ours = [line for line in (res.stdout + res.stderr).splitlines() if "infera-" in line]
    if res.returncode != 0 or ours:
        return f"exit {res.returncode}:\n{res.stdout}{res.stderr}"
    return ""


def k8s_validate(manifest: Path) -> str:
    try:
        import kubernetes_validate
    except ImportError:
        _missing("kubernetes-validate (pip)")
    problems = []
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d is not None]
    assert docs, manifest
    for version in K8S_VERSIONS:
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.path)
                problems.append(
                    f"{version} {doc.get('kind')} {doc['metadata']['name']}: {where}: {exc.message}"
                )
    return "\n".join(problems)


def compose_config(compose: Path) -> str:
    cmd = _compose()
    if cmd is None:
        _missing("docker compose / docker-compose")
    assert cmd is not None
    res = _run([*cmd, "-f", compose.name, "config", "-q"], cwd=compose.parent)
    return "" if res.returncode == 0 else f"exit {res.returncode}:\n{res.stdout}{res.stderr}"


def shell_check(script: Path, shell: str, exclude: str = "") -> str:
    tool = _tool("shellcheck")
    problems = []
    res = _run(
        [
            tool,
            "--shell",
            shell,
            "--severity",
            "style",
            *(["--exclude", exclude] if exclude else []),
            str(script),
        ]
    )
    if res.returncode != 0:
        problems.append(res.stdout + res.stderr)
    res = _run(["bash", "-n", str(script)])
    if res.returncode != 0:
        problems.append("bash -n: " + res.stderr)
    return "\n".join(problems)


# -- every variant, every format --------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path, variant: str) -> None:
    units = _emit(tmp_path, variant, "systemd")
    assert [u.suffix for u in units] == [".service"] * len(units)
    assert systemd_verify(units) == ""


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_k8s_manifest_passes_the_kubernetes_schemas(tmp_path: Path, variant: str) -> None:
    (manifest,) = _emit(tmp_path, variant, "k8s")
    assert k8s_validate(manifest) == ""


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compose_file_passes_docker_compose_config(tmp_path: Path, variant: str) -> None:
    (compose,) = _emit(tmp_path, variant, "compose")
    assert compose_config(compose) == ""


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_shell_script_passes_shellcheck_and_bash_n(tmp_path: Path, variant: str) -> None:
    (script,) = _emit(tmp_path, variant, "shell")
    assert script.name == "launch.sh"
    assert shell_check(script, "bash") == ""


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_env_files_pass_shellcheck_as_sourced_sh(tmp_path: Path, variant: str) -> None:
    files = _emit(tmp_path, variant, "env")
    assert files
    for f in files:  # assignments only, sourced under `set -a`: "appears unused" (SC2034) is the point
        assert shell_check(f, "sh", exclude="SC2034") == "", f.name


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_json_spec_reads_back_as_the_same_deployment(tmp_path: Path, variant: str) -> None:
    (spec,) = _emit(tmp_path, variant, "json")
    again = kvd("launch", "--spec", str(spec), "--format", "json")
    assert again.code == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(spec.read_text())


# -- each validator rejects a broken file (it checks something) -----------------------------------


def test_systemd_analyze_rejects_a_unit_whose_interpreter_does_not_exist(tmp_path: Path) -> None:
    (kvd_unit,) = [u for u in _emit(tmp_path, "single", "systemd") if u.name == "infera-kvd.service"]
    text = kvd_unit.read_text()
    kvd_unit.write_text(text.replace(f"ExecStart={sys.executable} ", "ExecStart=/nonexistent/bin/python ", 1))
    assert kvd_unit.read_text() != text
    assert "/nonexistent/bin/python is not executable" in systemd_verify([kvd_unit])


def test_kubernetes_schemas_reject_an_unknown_field(tmp_path: Path) -> None:
    (manifest,) = _emit(tmp_path, "single", "k8s")
    manifest.write_text(manifest.read_text().replace("image:", "imagez:", 1))
    assert "'imagez' was unexpected" in k8s_validate(manifest)


def test_docker_compose_rejects_an_unknown_key(tmp_path: Path) -> None:
    (compose,) = _emit(tmp_path, "single", "compose")
    compose.write_text(compose.read_text().replace("    restart: unless-stopped", "    restarts: always", 1))
    assert "restarts" in compose_config(compose)


def test_shellcheck_rejects_an_unquoted_expansion(tmp_path: Path) -> None:
    (script,) = _emit(tmp_path, "single", "shell")
    script.write_text(script.read_text().replace("part=${1:-all}", "part=${1:-all}\necho $part", 1))
    assert "SC2086" in shell_check(script, "bash")
