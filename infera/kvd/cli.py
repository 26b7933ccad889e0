"""``kvd serve``, ``kvd stat`` and ``kvd demo``. The daemon's flags come from :mod:`infera.kvd.flags`."""

from __future__ import annotations

import typer

from infera.clikit import socket_option
from infera.kvd.flagopts import flatten, options
from infera.kvd.flags import FlagValues

SERVE_HELP = "Run the per-host kvd daemon (same flags as `python -m infera.kvd`)."


@flatten(options(env=True), into="flags")
def serve(flags: FlagValues) -> None:
    """Run the per-host kvd daemon."""
    from infera.clikit import run_guarded
    from infera.kvd.config import build_config
    from infera.kvd.daemon import run_daemon

    code = run_guarded(lambda: run_daemon(build_config(flags)))
    raise typer.Exit(code or 0)


def stat(
    socket: str = socket_option("Socket of the daemon to read."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    watch: float = typer.Option(
        None,
        "--watch",
        metavar="SECONDS",
        help="Print again every SECONDS (0.1 to 3600) until Ctrl-C; an unreachable daemon is one line "
        "per attempt and the watch goes on.",
    ),
    all_fields: bool = typer.Option(False, "--all", help="Print every counter, not only the main ones."),
) -> None:
    """Print the daemon's counters."""
    from infera.clikit import run_guarded
    from infera.kvd.statctl import run_stat

    raise typer.Exit(run_guarded(run_stat, socket, json_out=json_out, watch=watch, all_fields=all_fields))


def demo(
    chunks: int = typer.Option(64, "--chunks", help="How many synthetic KV chunks to write (at least 1)."),
    chunk_size: str = typer.Option(
        "1M", "--chunk-size", help="Size of each chunk; the arena is twice the chunks and must fit in RAM."
    ),
    keep_socket: bool = typer.Option(False, "--keep", help="Leave the daemon running at the end."),
) -> None:
    """A daemon on a temporary socket: write synthetic KV chunks, read them from another process.

    Then the daemon restarts (RAM gone, disk tier kept), a new reader gets the same chunks from
    disk, and the daemon's counters are shown."""
    from infera.clikit import run_guarded
    from infera.kvd.arena import check_fits_host
    from infera.kvd.demo import run_demo

    raise typer.Exit(
        run_guarded(
            run_demo, chunks=chunks, chunk_size=chunk_size, keep=keep_socket, fits_host=check_fits_host
        )
    )


def register(app: typer.Typer) -> None:
    app.command("serve", help=SERVE_HELP)(serve)
    app.command("stat")(stat)
    app.command("demo")(demo)
