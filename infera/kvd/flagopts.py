"""The daemon's flag table as Typer options, flattened into a command (like uv's ``#[command(flatten)]``).

``kvd serve`` takes every flag with its environment variable. ``kvd launch single|pd`` take every
flag without one (they write commands for a daemon elsewhere, and the environment of whoever runs
``kvd launch`` is not that daemon's). ``kvd doctor`` takes the flags marked ``doctor``. The name,
default, help and metavar always come from :data:`infera.kvd.flags.FLAGS`; a tool may add a note to
the help, or (``kvd launch --socket``) choose another default, which its help then says.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import typer

from infera.kvd.flags import FLAGS, Flag, FlagValues

F = TypeVar("F", bound=Callable[..., Any])
_CTX = "flag_ctx__"
_TYPES: dict[str, Any] = {"value": str, "list": list[str], "switch": bool}


@dataclass(frozen=True)
class ToolDefault:
    """A tool's own default for a flag, and why (shown in its help)."""

    value: str
    why: str


def _escape(text: str) -> str:
    """Help text as Rich markup: square brackets are literal."""
    return text.replace("[", "\\[")


def options(
    flags: Iterable[Flag] = FLAGS,
    *,
    env: bool,
    notes: Mapping[str, str] | None = None,
    defaults: Mapping[str, ToolDefault] | None = None,
    panel: str | None = None,
) -> list[inspect.Parameter]:
    """Typer parameters (keyword-only, named by ``dest``) for ``flags``."""
    out: list[inspect.Parameter] = []
    for f in flags:
        default: Any = f.default
        show = f.default_text is None
        help = f.help + (" " + notes[f.name] if notes and f.name in notes else "")
        help += f" [default: {f.default_text}]" if f.default_text else ""
        own = (defaults or {}).get(f.name)
        if own is not None:
            default, show = own.value, True
            help = f"{f.help} {own.why} (the daemon's own default: {f.default_text or f.default})."
        if f.kind == "list":
            default = []
        elif f.kind == "switch":
            default = False
        opt = typer.Option(
            default,
            f.name,
            help=_escape(help),
            envvar=f.env if env else None,
            metavar=None if f.kind == "switch" else f.metavar,
            show_default=show,
            rich_help_panel=panel,
        )
        out.append(
            inspect.Parameter(f.dest, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=_TYPES[f.kind])
        )
    return out


def flatten(
    params: list[inspect.Parameter],
    into: str,
    make: Callable[[dict[str, Any], frozenset[str]], Any] = FlagValues,
) -> Callable[[F], F]:
    """Add ``params`` to a Typer command; the command gets their values as one argument ``into``:
    ``make(values by name, option names given on the command line)``, a :class:`FlagValues` by default.
    Groups stack: ``@flatten(a, "x")`` over ``@flatten(b, "y")``."""
    names = [p.name for p in params]

    def deco(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != into
        ]
        # Typer hands the context to one parameter: the command's own, or one added here
        ctx_name = next((p.name for p in own if p.annotation is typer.Context), None)
        ctx = (
            []
            if ctx_name
            else [inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
        )

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:  # Typer calls a command with keyword arguments only
            context = kwargs[ctx_name] if ctx_name else kwargs.pop(_CTX)
            values = {n: kwargs.pop(n) for n in names}
            given = frozenset(
                p.default.param_decls[0] for p in params if _source(context, p.name) == "COMMANDLINE"
            )
            return fn(**kwargs, **{into: make(values, given)})

        wrapper.__signature__ = sig.replace(parameters=[*own, *ctx, *params])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {}
        return wrapper  # type: ignore[return-value]

    return deco


def _source(ctx: typer.Context, name: str) -> str | None:
    src = ctx.get_parameter_source(name)
    return None if src is None else src.name
