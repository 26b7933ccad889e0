"""``kvd doctor``: the Typer surface. Exit 0 when nothing failed, 1 when a check failed, 2 on bad usage."""

from __future__ import annotations

import typer

DOCTOR_HELP = (
    "Preflight for kvd and GPU-direct L3: driver, AIS, kernel, storage, hashing, daemon.\n\n"
    "Each check says ok / warn / fail / unknown / skip with the evidence it read (--verbose) and, "
    "for every problem, the next step. Exit status: 0 nothing failed, 1 a check failed, 2 usage error. "
    "Docs: docs/doctor/README.md."
)


def doctor(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: checks and a summary."),
    check: list[str] = typer.Option(
        [],
        "--check",
        "-c",
        metavar="NAME",
        help="Run only this check or area (repeatable). See --list-checks.",
    ),
    root: str = typer.Option(
        "/", "--root", metavar="DIR", help="Read host files under DIR (a mounted host or a fixture tree)."
    ),
    socket: str = typer.Option(
        None,
        "--socket",
        metavar="PATH",
        help="Daemon socket to include (default: $INFERA_KVD_SOCKET or the per-user path, when present).",
    ),
    long_path: str = typer.Option(
        None, "--long-path", metavar="DIR", help="Long-tier directory for the storage checks."
    ),
    etcd: str = typer.Option(
        None,
        "--etcd",
        metavar="HOST:PORT",
        help="etcd the P/D engines register in: list the workers and check their pairing.",
    ),
    etcd_prefix: str = typer.Option(
        None,
        "--etcd-prefix",
        metavar="PREFIX",
        help="Key prefix of the registrations (the engines' --discovery-prefix).",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Show the evidence and notes behind every check."
    ),
    list_checks: bool = typer.Option(False, "--list-checks", help="List the checks and exit."),
) -> None:
    """Check this host (or a container, saying what it cannot know) before turning on kvd."""
    from infera.clikit import run_guarded

    def _go() -> int:
        import json
        import os

        from infera.doctor.context import DoctorOptions
        from infera.doctor.registry import AREAS, select
        from infera.doctor.render import render_text
        from infera.doctor.run import run_doctor
        from infera.errors import UsageError

        if list_checks:
            specs = select(check)
            if json_out:
                typer.echo(
                    json.dumps([{"id": s.id, "title": s.title, "area": s.area} for s in specs], indent=2)
                )
            else:
                for s in specs:
                    typer.echo(f"{s.id:<16} {AREAS.get(s.area, s.area):<26} {s.title}")
            return 0
        if not os.path.isdir(root):
            raise UsageError(
                f"--root {root} is not a directory", hint="give the directory a host is mounted at"
            )
        select(check)  # unknown names are a usage error before anything runs
        if etcd:
            from infera.discovery.etcd import parse_endpoints

            parse_endpoints(etcd)
        opts = DoctorOptions(
            root=root,
            socket=socket,
            socket_explicit=socket is not None,
            long_path=long_path,
            etcd=etcd,
            etcd_prefix=etcd_prefix,
            checks=list(check),
            verbose=verbose,
        )
        report = run_doctor(opts)
        if json_out:
            typer.echo(json.dumps(report.to_json(), indent=2))
        else:
            typer.echo(render_text(report, verbose=verbose), nl=False)
        return report.exit_code

    code = run_guarded(_go)
    raise typer.Exit(code or 0)


def register(app: typer.Typer) -> None:
    app.command("doctor", help=DOCTOR_HELP)(doctor)
