"""The ``kvd`` command: one Typer app, each subcommand delegating to its package.

Subcommand modules are imported lazily inside each command so that ``kvd --help`` and
``kvd doctor`` stay fast and do not pull in optional dependencies (Textual, vLLM, Mooncake).
"""

from __future__ import annotations

import sys

import typer

from infera import __version__
from infera.clikit import OneLineGroup, escape_help, report
from infera.errors import KvdError

app = typer.Typer(
    name="kvd",
    cls=OneLineGroup,  # every command's option errors are one `error:` line (exit 2)
    help="infera-kvd: a per-host KV-cache daemon for vLLM, and the tools around it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvd {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """infera-kvd command line."""


def _register() -> None:
    """Attach each package's commands. Each package keeps its own Typer surface in a `cli` module."""
    from infera.kvd import cli as kvd_cli

    kvd_cli.register(app)
    for modname in ("infera.doctor.cli", "infera.launch.cli", "infera.tui.cli", "infera.bench.cli"):
        try:
            mod = __import__(modname, fromlist=["register"])
        except ImportError as exc:  # a package that is not built yet must not break the others
            if exc.name and modname.startswith(exc.name):
                continue
            raise
        mod.register(app)


_register()
escape_help(app)  # help strings are plain text: `[default: ...]` must not vanish as Rich markup

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KvdError as err:  # raised outside a guarded command
        sys.exit(report(err))


if __name__ == "__main__":
    main()
