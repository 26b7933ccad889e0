"""Small CLI helpers shared by every command, importable without building the whole `kvd` app.

* :func:`report`, :func:`fail`, :func:`run_guarded`: a :class:`KvdError` is one line (plus its hint)
  on stderr and an exit status, never a traceback.
* :func:`missing_extra`: the one-line error for an optional dependency that is not installed; it
  names the extra that brings it (``pip install 'infera-kvd[tui]'``).
* :func:`escape_help`: Typer renders help as Rich markup, where ``[default: x]`` is a style tag and
  vanishes; this escapes every help text of an app in one place, so help strings are plain text.
* :func:`socket_option`: ``--socket`` of the tools that talk to a running daemon, with the daemon's
  default and environment variable in its help.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import typer
from typer.models import ParameterInfo

from infera.errors import KvdError

_BRACKET = re.compile(r"(?<!\\)\[")


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


def missing_extra(what: str, package: str, extra: str, note: str = "") -> KvdError:
    """The error for an optional dependency that does not import: one line naming the extra.

    ``missing_extra("kvd top", "Textual", "tui")`` reads
    ``kvd top needs Textual, which is not installed: pip install 'infera-kvd[tui]'``.
    """
    return KvdError(
        f"{what} needs {package}, which is not installed: pip install 'infera-kvd[{extra}]'{note}"
    )


# -- help text ------------------------------------------------------------------------------------


def escape_markup(text: str) -> str:
    """``text`` as Rich markup that renders literally: every ``[`` not escaped already gets a ``\\``."""
    return _BRACKET.sub(r"\\[", text)


def _escape_params(fn: Any) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    for p in sig.parameters.values():
        info = p.default
        if isinstance(info, ParameterInfo) and isinstance(info.help, str):
            info.help = escape_markup(info.help)


def _escape_callable(fn: Any) -> None:
    if not callable(fn):
        return
    if isinstance(getattr(fn, "__doc__", None), str):
        try:
            fn.__doc__ = escape_markup(fn.__doc__)
        except AttributeError:  # a builtin or a bound method: nothing of ours
            pass
    _escape_params(fn)


def _escape_info(info: Any) -> None:
    """A CommandInfo or TyperInfo: its own help, its callback's docstring and options."""
    if info is None:
        return
    if isinstance(getattr(info, "help", None), str):
        info.help = escape_markup(info.help)
    _escape_callable(getattr(info, "callback", None))


def escape_help(app: typer.Typer) -> typer.Typer:
    """Make every help text of ``app``, its commands and sub-apps plain text under Rich markup.

    Help strings (``help=``, docstrings) then say ``[default: ...]`` or ``[all|kvd]`` as written;
    Typer's own ``[default: x]`` and ``[env var: X]`` are added after this and stay styled.
    Idempotent: ``\\[`` stays as it is. Returns ``app``.
    """
    _escape_info(app.info)
    _escape_info(app.registered_callback)
    for cmd in app.registered_commands:
        _escape_info(cmd)
    for group in app.registered_groups:
        _escape_info(group)
        if group.typer_instance is not None:
            escape_help(group.typer_instance)
    return app


def socket_option(what: str = "Daemon socket.") -> Any:
    """``--socket PATH`` of a tool that talks to a running daemon: default and env var in its help."""
    from infera.kvd.flags import BY_NAME

    flag = BY_NAME["--socket"]
    return typer.Option(
        None,
        "--socket",
        metavar="PATH",
        envvar=flag.env,
        show_envvar=True,
        show_default=False,
        help=f"{what} [default: {flag.default_text}]",
    )
