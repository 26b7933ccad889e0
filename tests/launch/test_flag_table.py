"""One table of daemon flags (infera/kvd/flags.py): `kvd serve`, `kvd launch`, `kvd lint` and `kvd doctor`
take the same flags with the same defaults and help, and refuse the same bad values with the same message.

Adding a flag to `kvd serve` any other way than through the table fails here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from launchkit import kvd

from infera.cli import app
from infera.errors import UsageError
from infera.kvd.config import DaemonConfig, build_config
from infera.kvd.flagopts import _escape
from infera.kvd.flags import BY_NAME, FLAGS, Flag
from infera.launch.cli import LAUNCH_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
SOCKET = "/run/t.sock"
# valid values for the flags that have no default (what a flag needs besides itself is in _context)
GOOD = {
    "--socket": SOCKET,
    "--long-path": "/nvme/kvd-long",
    "--long-bytes": "256G",
    "--long-backend": "disk",
    "--allow-uid": "65534",
    "--metrics-port": "9400",
    "--mooncake-master": "10.0.0.5:50051",
    "--mooncake-device": "mlx5_0",
    "--lmcache-url": "lm://10.0.0.5:65432",
    "--prefault": "",
}


def _command(*path: str) -> Any:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def _options(*path: str) -> dict[str, Any]:
    """``--flag`` -> click option of a `kvd` command (without --help)."""
    return {p.opts[0]: p for p in _command(*path).params if p.opts and p.opts[0] != "--help"}


def _table_default(f: Flag) -> Any:
    return [] if f.kind == "list" else False if f.kind == "switch" else f.default


def _context(f: Flag) -> list[str]:
    """The other flags that make ``f`` meaningful (its backend, the disk tier's pair)."""
    if f.backend == "mooncake":
        master = [] if f.name == "--mooncake-master" else ["--mooncake-master", GOOD["--mooncake-master"]]
        return ["--long-backend", "mooncake", *master]
    if f.backend == "lmcache":
        return ["--long-backend", "lmcache"]
    if f.name in ("--long-path", "--long-bytes", "--long-backend"):
        return ["--long-path", GOOD["--long-path"], "--long-bytes", GOOD["--long-bytes"]]
    return []


def _arg(f: Flag, value: str) -> str:
    return f.name if f.kind == "switch" and value == "" else f"{f.name}={value}"


def _lint_messages(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """`kvd lint`'s KVD502 messages for a daemon started with ``argv`` (after ``--socket``, unless the
    socket comes from ``env``) and ``env``."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    socket = "" if "INFERA_KVD_SOCKET" in (env or {}) else f"--socket {SOCKET}"
    line = f"{prefix} python -m infera.kvd {socket} {shlex.join(argv)}".strip()
    res = kvd(
        "lint", "--format", "json", "--select", "KVD502", "--stdin-filename", "kvd.sh", "-", stdin=line + "\n"
    )
    return [f["message"] for f in json.loads(res.stdout)["findings"]]


def _daemon_error(argv: list[str]) -> str:
    """What `kvd serve` says about ``argv`` (the daemon is never started)."""
    res = kvd("serve", "--socket", SOCKET, *argv)
    assert res.code == 2, res.stdout + res.stderr
    return res.stderr.splitlines()[0].removeprefix("error: ")


@pytest.fixture(autouse=True)
def _no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(cfg: DaemonConfig) -> int:
        raise AssertionError(f"the daemon would have started with {cfg}")

    monkeypatch.setattr("infera.kvd.daemon.run_daemon", refuse)


def test_the_table_is_well_formed() -> None:
    assert len(BY_NAME) == len(FLAGS)
    for f in FLAGS:
        assert re.fullmatch(r"--[a-z][a-z0-9-]*", f.name) and f.help.endswith("."), f.name
        assert f.bad is not None or f.no_bad, (
            f"{f.name}: give an example of a bad value, or say why none exists"
        )
        assert f.default is not None or f.name in GOOD, f"{f.name}: add a valid value to GOOD"


def test_every_serve_flag_comes_from_the_table_with_its_default_and_env() -> None:
    opts = _options("serve")
    assert list(opts) == [f.name for f in FLAGS]
    for f in FLAGS:
        o = opts[f.name]
        assert (o.default, o.envvar) == (_table_default(f), f.env), f.name
        assert o.help.startswith(_escape(f.help)), f.name
    assert [p.opts[0] for p in _command("serve").params if p.opts[0] != "--help"] == [
        p.opts[0] for p in _options("serve").values()
    ]


@pytest.mark.parametrize("kind", ["single", "pd"])
def test_launch_takes_every_daemon_flag_with_the_same_default_and_help(kind: str) -> None:
    opts = _options("launch", kind)
    for f in FLAGS:
        o = opts[f.name]
        assert o.envvar is None, f"{f.name}: kvd launch writes commands; it does not read the daemon's env"
        own = LAUNCH_DEFAULTS.get(f.name)
        if own is None:
            assert o.default == _table_default(f) and o.help.startswith(_escape(f.help)), f.name
        else:  # a launch-level default, said so in the help
            assert o.default == own.value and own.why in o.help and "daemon's own default" in o.help


def test_doctor_takes_its_daemon_flags_from_the_table() -> None:
    opts = _options("doctor")
    assert {n for n in opts if n in BY_NAME} == {f.name for f in FLAGS if f.doctor}
    for f in FLAGS:
        if f.doctor:
            o = opts[f.name]
            assert o.default == _table_default(f) and o.help.startswith(_escape(f.help)) and o.envvar is None


def test_defaults_pass_every_tool() -> None:
    assert _lint_messages([]) == []
    cfg = build_config()
    assert dataclasses.asdict(cfg) == dataclasses.asdict(DaemonConfig()), "DaemonConfig's defaults drifted"
    fields = {f.name for f in dataclasses.fields(DaemonConfig)}
    assert {f.dest for f in FLAGS} - fields == {"allow_uid"}  # resolved into allow_uids / allow_any_uid


@pytest.mark.parametrize("flag", FLAGS, ids=[f.name for f in FLAGS])
def test_a_good_value_of_every_flag_passes_every_tool(flag: Flag) -> None:
    value = GOOD.get(flag.name, flag.default or "")
    argv = [*_context(flag), _arg(flag, value)]
    assert _lint_messages(argv) == []
    res = kvd("launch", "single", "--model", "m", *argv, "--format", "json")
    assert res.code == 0, res.stderr
    assert flag.name in json.loads(res.stdout)["daemon"]["argv"]  # launch writes what it was given


BAD = [f for f in FLAGS if f.bad is not None]


@pytest.mark.parametrize("flag", BAD, ids=[f.name for f in BAD])
def test_a_bad_value_of_every_flag_is_refused_by_every_tool_with_the_same_message(flag: Flag) -> None:
    assert flag.bad is not None
    argv = [*_context(flag), f"{flag.name}={flag.bad}"]
    if flag.kind == "switch":  # the parser refuses a value for a switch, before any validator
        assert f"daemon: {flag.name} takes no value" in _lint_messages(argv)
        res = kvd("serve", "--socket", SOCKET, *argv)
        assert res.code == 2 and "does not take a value" in res.stdout + res.stderr
        return
    message = _daemon_error(argv)
    assert message.startswith(f"{flag.name}: "), message
    if flag.bad != "":  # the message is the validator's own (an empty value is refused before it)
        with pytest.raises(UsageError) as err:
            flag.parse(flag.bad if flag.kind == "value" else [flag.bad], flag.name)
        assert err.value.message == message
    assert f"daemon: {message}" in _lint_messages(argv)
    if flag.kind == "value":  # `--flag VALUE` as well as `--flag=VALUE`
        assert f"daemon: {message}" in _lint_messages([*_context(flag), flag.name, flag.bad])
    res = kvd("launch", "single", "--model", "m", *argv)
    assert res.code == 2 and res.stderr.splitlines()[0] == f"error: {message}", res.stderr


ENV_BAD = [f for f in FLAGS if f.env and f.bad]  # an empty variable is no value at all
BACKEND = [f for f in FLAGS if f.backend]


@pytest.mark.parametrize("flag", ENV_BAD, ids=[f.name for f in ENV_BAD])
def test_a_bad_value_through_the_environment_is_refused(flag: Flag, monkeypatch: pytest.MonkeyPatch) -> None:
    assert flag.env and flag.bad
    assert any(
        m.startswith(f"daemon: {flag.name}: ") for m in _lint_messages(_context(flag), {flag.env: flag.bad})
    )
    monkeypatch.setenv(flag.env, flag.bad)
    socket = [] if flag.name == "--socket" else ["--socket", SOCKET]
    res = kvd("serve", *socket, *_context(flag))
    assert res.code == 2 and res.stderr.startswith(f"error: {flag.name}: "), res.stderr


@pytest.mark.parametrize("flag", BACKEND, ids=[f.name for f in BACKEND])
def test_a_backend_flag_without_its_backend_is_refused(flag: Flag, monkeypatch: pytest.MonkeyPatch) -> None:
    value = GOOD.get(flag.name, flag.default or "")
    message = f"{flag.name} needs --long-backend {flag.backend}"
    assert _daemon_error([_arg(flag, value)]) == message
    assert _lint_messages([_arg(flag, value)]) == [f"daemon: {message}"]
    assert kvd("launch", "single", "--model", "m", _arg(flag, value)).stderr.startswith(f"error: {message}")
    if flag.env:  # from the environment it is ignored: one variable may serve several daemons
        assert _lint_messages([], {flag.env: value}) == []
        monkeypatch.setenv(flag.env, value)
        with pytest.raises(AssertionError, match="would have started"):
            kvd("serve", "--socket", SOCKET)


def test_serve_help_shows_every_flag_with_its_default_and_env() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_KVD_")}
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--help"],
        capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "200", "PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    blocks = {}  # --flag -> its help, unwrapped
    for block in re.split(r"\n(?=│ --)", out):
        words = " ".join(block.replace("│", " ").replace("╰", " ").split())
        if words.startswith("--"):
            blocks[words.split()[0]] = words
    assert set(blocks) == {f.name for f in FLAGS} | {"--help"}
    for f in FLAGS:
        text = blocks[f.name]
        assert " ".join(f.help.split()) in text, text
        if f.default is not None:
            assert f"[default: {f.default}]" in text, text
        if f.env:
            assert f"[env var: {f.env}]" in text, text
    assert "[default: $INFERA_KVD_SOCKET, else $XDG_RUNTIME_DIR/infera-kvd.sock" in blocks["--socket"]


def test_the_table_imports_no_daemon_runtime() -> None:
    code = (
        "import sys; import infera.kvd.flags; a = sorted(m for m in sys.modules if m.startswith('infera'));"
        "import infera.kvd.flagopts, infera.launch.cli, infera.doctor.cli, infera.launch.rules;"
        "b = sorted(m for m in sys.modules if m.startswith('infera.kvd'));"
        "print(a); print(b)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    table, tools = (eval(line) for line in res.stdout.splitlines())
    own = [m for m in table if not m.startswith("infera.kvd.flags.")]  # the table's package is its own
    assert own == ["infera", "infera.errors", "infera.kvd", "infera.kvd.flags", "infera.units"]
    runtime = {"server", "store", "arena", "tiers", "ops", "daemon", "metrics", "config"}
    assert not [m for m in tools if m.split(".")[2:3] and m.split(".")[2] in runtime], tools


def test_the_docs_list_every_flag_with_its_default() -> None:
    rows = [
        line
        for page in ("daemon.md", "l4.md")
        for line in (ROOT / "docs" / page).read_text().splitlines()
        if line.startswith("| `--")
    ]
    for f in FLAGS:
        row = next((r for r in rows if re.search(rf"`{f.name}[ `]", r.split("|")[1])), None)
        assert row is not None, f"{f.name} is not in docs/daemon.md or docs/l4.md"
        if f.default is not None:
            assert f"`{f.default}`" in row, row
        if f.env and f.backend:
            assert f.env in row, row
