"""Small CLI helpers shared by every command, importable without building the whole `kvd` app.

* :func:`report`, :func:`fail`, :func:`run_guarded`: a :class:`KvdError` is one line (plus its hint)
  on stderr and an exit status, never a traceback.
* :func:`missing_extra`: the one-line error for an optional dependency that is not installed; it
  names the extra that brings it (``pip install 'infera-kvd[tui]'``).
* :func:`escape_help`: Typer renders help as Rich markup, where ``[default: x]`` is a style tag and
  vanishes; this escapes every help text of an app in one place, so help strings are plain text.
* :func:`socket_option`: ``--socket`` of the tools that talk to a running daemon, with the daemon's
  default and environment variable in its help.
* :class:`OneLineGroup`, :class:`OneLineCommand`: a command-line mistake Typer catches itself (an
  unknown option, ``--port abc``, a missing value) is one ``error:`` line naming the option, exit 2,
  like every other usage error, instead of Typer's usage text and box. A command opts in with
  ``typer.Typer(cls=OneLineGroup)`` or ``app.command(cls=OneLineCommand)``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import ParameterInfo

from infera.errors import KvdError, UsageError

try:  # Typer >= 0.26 carries its own copy of click
    from typer._click.exceptions import BadParameter, NoArgsIsHelpError, NoSuchOption
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - older Typer uses click itself
    from click.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        BadParameter,
        NoArgsIsHelpError,
        NoSuchOption,
    )
    from click.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore,assignment]
        UsageError as ClickUsageError,
    )

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


# -- Typer's own usage errors as one line ------------------------------------------------------------

# what Typer's type conversion says (pydantic error types) -> what the value is not
_NOT_A = {"int_parsing": "a whole number", "float_parsing": "a number", "bool_parsing": "true or false"}


def usage_error(err: Any) -> UsageError:
    """A click/Typer usage error as our one-line :class:`UsageError` (with the help command as hint)."""
    ctx = getattr(err, "ctx", None)
    hint = f"`{ctx.command_path} --help` shows the usage" if ctx is not None else None
    if isinstance(err, NoSuchOption):
        near = sorted(err.possibilities or ())
        return UsageError(
            f"no such option: {err.option_name}",
            hint=f"did you mean {' or '.join(near)}?" if near else hint,
        )
    param = getattr(err, "param", None)
    if isinstance(err, BadParameter) and param is not None:
        name = max(getattr(param, "opts", None) or [str(param.name)], key=len)
        cause = getattr(err.__cause__, "errors", None)
        first = cause()[0] if callable(cause) and cause() else None
        if first is not None and first.get("type") in _NOT_A:
            return UsageError(f"{name}: {first.get('input')!r} is not {_NOT_A[first['type']]}", hint=hint)
        return UsageError(f"{name}: {_sentence(err.message)}", hint=hint)
    return UsageError(_sentence(err.format_message()), hint=hint)


def _sentence(text: str) -> str:
    """Click's message as our one line: joined, lower-case start (unless an acronym), no final dot."""
    line = " ".join(str(text).split()).rstrip(".")
    if len(line) > 1 and line[0].isupper() and not line[1].isupper():
        line = line[0].lower() + line[1:]
    return line


def _one_line(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except NoArgsIsHelpError:  # `kvd launch` alone prints its help, as Typer does
        raise
    except ClickUsageError as err:
        fail(usage_error(err))


class OneLineCommand(TyperCommand):
    """A Typer command whose option errors are one ``error:`` line (exit 2)."""

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        return _one_line(lambda: super(OneLineCommand, self).make_context(info_name, args, parent, **extra))


class OneLineGroup(TyperGroup):
    """A Typer group whose option errors, and those of every command under it, are one line (exit 2)."""

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        return _one_line(lambda: super(OneLineGroup, self).make_context(info_name, args, parent, **extra))

    def invoke(self, ctx: Any) -> Any:
        return _one_line(lambda: super(OneLineGroup, self).invoke(ctx))
