"""Every ``kvd`` command's ``--help`` as a user sees it: nothing written in square brackets vanishes.

Typer renders help as Rich markup, where ``[default: x]`` is a style tag and disappears (``Daemon
socket .``). :func:`infera.clikit.escape_help` makes every help string of the app plain text; this
renders the help of ``kvd`` and of each subcommand, recursively, and checks that each option's help
appears as written, that every ``[...]`` of a help string or docstring is still there, and that no
help line is left with a dangling `` .`` or an empty ``()``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from infera.cli import app
from infera.kvd.cli import serve

BRACKETS = re.compile(r"(?<!\\)\[[^\]]*\]")
DANGLING = re.compile(r"\s\.(?:\s|$)|\(\s*\)")


def _walk(cmd: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """(path, command) for ``cmd`` and every command below it (Typer's Click objects)."""
    out = [(path, cmd)]
    if isinstance(getattr(cmd, "commands", None), dict):
        for name, sub in sorted(cmd.commands.items()):
            out += _walk(sub, [*path, name])
    return out


COMMANDS = _walk(typer.main.get_command(app), [])


def _plain(text: str) -> str:
    """Help as written: Rich escapes undone, whitespace collapsed."""
    return " ".join(text.replace("\\[", "[").split())


def _render(target: typer.Typer, args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 4000)  # one line per option: no wrapping
    res = CliRunner().invoke(target, [*args, "--help"])
    assert res.exit_code == 0, res.output
    # box drawing and padding out, so a help cell reads as one run of words
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())


def _check(cmd: Any, shown: str, where: str) -> None:
    for param in cmd.params:
        text = getattr(param, "help", None)
        if not text:
            continue
        assert _plain(text) in shown, f"{where} {param.opts[0]}: help shown differently:\n{shown}"
        for seg in BRACKETS.findall(text.replace("\\[", "[")):
            assert seg in shown, f"{where} {param.opts[0]}: {seg!r} vanished"
    for seg in BRACKETS.findall((cmd.help or "").replace("\\[", "[")):
        assert _plain(seg) in shown, f"{where}: {seg!r} of its description vanished"
    bad = DANGLING.search(shown)
    assert bad is None, f"{where}: dangling {bad.group(0)!r} in:\n{shown}"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(["kvd", *p]) for p, _ in COMMANDS])
def test_help_shows_every_bracket_as_written(
    path: list[str], cmd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(cmd, _render(app, path, monkeypatch), " ".join(["kvd", *path]))


def test_every_subcommand_is_covered() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"serve", "stat", "top", "doctor", "demo", "lint", "launch", "launch single", "launch pd"} <= names


def test_python_m_infera_kvd_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m infera.kvd`` is ``typer.run(serve)``: the README's first "Turn it on" command."""
    single = typer.Typer()
    single.command()(serve)
    _check(typer.main.get_command(single), _render(single, [], monkeypatch), "python -m infera.kvd")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["stat"], "[default: $INFERA_KVD_SOCKET, else $XDG_RUNTIME_DIR/infera-kvd.sock, else /tmp/infera-kvd-UID/kvd.sock]"),
        (["stat"], "[env var: INFERA_KVD_SOCKET]"),
        (["top"], "[default: $INFERA_KVD_SOCKET, else $XDG_RUNTIME_DIR/infera-kvd.sock, else /tmp/infera-kvd-UID/kvd.sock]"),
        (["top"], "[env var: INFERA_KVD_SOCKET]"),
        (["serve"], "[env var: INFERA_KVD_SOCKET]"),
        (["launch", "pd"], "Routable address of the decode host [default: --advertise-host]."),
        (["launch", "single"], "[default: /var/run/infera-kvd.sock]"),
        (["launch", "single"], "[default: this kvd's Python,"),
        (["doctor"], "[default: $INFERA_KVD_SOCKET, else"),
    ],
)  # fmt: skip
def test_defaults_and_env_vars_are_in_the_help(
    args: list[str], needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert needle in _render(app, args, monkeypatch)
