"""``kvd top``: the command line around :class:`infera.tui.app.TopApp`.

Textual is the optional extra ``tui``; it is imported only when the command runs, so ``kvd --help``
stays fast and a base install says how to get it instead of failing with an ImportError.
"""

from __future__ import annotations

import sys

import typer

from infera.clikit import socket_option

INSTALL_HINT = "install the extra: pip install 'infera-kvd[tui]'"
NEEDS_TERMINAL = "kvd top needs a terminal; kvd stat --json prints the same counters"


def top(
    socket: str = socket_option("Socket of the daemon to watch."),
    interval: float = typer.Option(
        1.0, "--interval", metavar="SECONDS", help="Seconds between refreshes (0.1 to 3600)."
    ),
) -> None:
    """Live dashboard of a running daemon: hit ratio, rates, fill, clients, warnings (q quits, ? helps)."""
    from infera.clikit import run_guarded

    code = run_guarded(run_top, socket, interval)
    raise typer.Exit(code or 0)


def run_top(socket: str | None, interval: float) -> int:
    """Check the arguments, then run the dashboard until the user quits. Returns the exit status."""
    from infera.clikit import missing_extra
    from infera.errors import UsageError
    from infera.kvd.protocol import default_socket_path
    from infera.units import refresh_interval

    interval = refresh_interval(interval, "--interval")
    try:
        import textual  # noqa: F401
    except ImportError:
        raise missing_extra("kvd top", "Textual", "tui") from None
    if not sys.stdout.isatty():  # a full-screen program: escapes in a file, and no key ends it
        raise UsageError(NEEDS_TERMINAL)
    from infera.tui.app import TopApp

    app = TopApp(socket or default_socket_path(), interval)
    result = app.run()
    return int(result or 0)


def register(app: typer.Typer) -> None:
    app.command("top")(top)
