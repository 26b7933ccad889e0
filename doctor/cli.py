"""``kvd doctor``: the Typer surface. Exit 0 when nothing failed, 1 when a check failed, 2 on bad usage."""

from __future__ import annotations

import typer

from infera.kvd.flagopts import flatten, options
from infera.kvd.flags import FLAGS, FlagValues

# the daemon's flags kvd doctor takes: the same name, default and help as `kvd serve`, plus what doctor does with it
DOCTOR_NOTES = {
    "--socket": "kvd doctor checks the daemon there, and skips the daemon checks when nothing is there "
    "and --socket is not given.",
    "--long-path": "kvd doctor runs the storage checks on it.",
    "--max-bytes": "kvd doctor checks memory limits against it (default: the running daemon's arena).",
    "--allow-uid": "kvd doctor says who may map the arena (default: the running daemon's).",
    "--long-backend": "kvd doctor checks what it needs (default: the running daemon's).",
    "--mooncake-protocol": "kvd doctor checks the locked-memory limit RDMA needs (default: the running daemon's).",
    "--mooncake-segment-bytes": "kvd doctor counts it in the memory the daemon needs.",
    "--mooncake-buffer-bytes": "kvd doctor counts it in the memory the daemon needs.",
}
DAEMON_OPTIONS = options([f for f in FLAGS if f.doctor], env=False, notes=DOCTOR_NOTES)

DOCTOR_HELP = (
    "Preflight for kvd and GPU-direct L3: driver, AIS, kernel, storage, hashing, daemon.\n\n"
    "Each check says ok / warn / fail / unknown / skip with the evidence it read (--verbose) and, "
    "for every problem, the next step. Exit status: 0 nothing failed, 1 a check failed, 2 usage error. "
    "Docs: docs/doctor/README.md."
)


@flatten(DAEMON_OPTIONS, into="daemon")
def doctor(
    daemon: FlagValues,
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
    probe_isolation: bool = typer.Option(
        False,
        "--probe-isolation",
        help="Send a prompt to --engine with one cache_salt, then with another and with none, and fail "
        "if either is an external (kvd) hit. Runs only this probe unless --check says more.",
    ),
    engine: str = typer.Option(
        None,
        "--engine",
        metavar="URL",
        help="The engine's OpenAI server for --probe-isolation, e.g. http://127.0.0.1:8000.",
    ),
) -> None:
    """Check this host (or a container, saying what it cannot know) before turning on kvd."""
    from infera.clikit import run_guarded

    socket, long_path = daemon.get("socket"), daemon.get("long_path")

    def _go() -> int:
        import json
        import os

        from infera.doctor.context import DoctorOptions
        from infera.doctor.registry import AREAS, select
        from infera.doctor.render import render_text
        from infera.doctor.run import run_doctor
        from infera.errors import UsageError
        from infera.kvd.flags import check as check_flags

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
        check_flags(daemon, together=False).raise_first()  # the daemon's own check of each value
        if etcd:
            from infera.discovery.etcd import parse_endpoints

            parse_endpoints(etcd)
        if probe_isolation and not engine:
            raise UsageError(
                "--probe-isolation needs --engine URL", hint="e.g. --engine http://127.0.0.1:8000"
            )
        if engine and not engine.startswith(("http://", "https://")):
            raise UsageError(f"--engine {engine!r} is not an http:// or https:// URL")
        from infera.kvd.flags import BY_NAME

        given = {BY_NAME[n].dest: daemon.values[BY_NAME[n].dest] for n in daemon.given if n in BY_NAME}
        given.pop("socket", None)
        given.pop("long_path", None)
        checks = list(check) or (["isolation", "arena-sharing"] if probe_isolation else [])
        opts = DoctorOptions(
            root=root,
            socket=socket,
            socket_explicit=socket is not None,
            long_path=long_path,
            etcd=etcd,
            etcd_prefix=etcd_prefix,
            checks=checks,
            verbose=verbose,
            daemon_flags=given,
            probe_isolation=probe_isolation,
            engine=engine,
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
