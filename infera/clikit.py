"""Small CLI helpers shared by every command, importable without building the whole `kvd` app."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from infera.errors import KvdError


def report(err: KvdError) -> int:
    """Print a KvdError as one line (plus its hint) on stderr; return the exit status it asks for."""
    typer.echo(f"error: {err.message}", err=True)
    if err.hint:
        typer.echo(f"hint: {err.hint}", err=True)
    return err.exit_code


def fail(err: KvdError) -> None:
    """Print a KvdError as :func:`report` does and exit the command with its status."""
    raise typer.Exit(report(err))


def run_guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` turning KvdError into a one-line error and Ctrl-C into exit status 130."""
    try:
        return fn(*args, **kwargs)
    except KvdError as err:
        fail(err)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
