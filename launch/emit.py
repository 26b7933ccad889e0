"""What ``kvd launch`` does with a deployment: check it against every rule, then save, print, write
or run it. ``kvd --help`` imports this module for :class:`Output`; what :func:`emit` needs (rules,
templates, spec files) loads when it runs."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from infera.launch.model import Deployment


@dataclass(frozen=True)
class Output:
    """What to do with a deployment: the options every ``kvd launch`` form shares."""

    fmt: str = "shell"
    json_out: bool = False
    emit: bool = False
    out: str | None = None
    run: bool = False
    part: str = "all"
    save_spec: str | None = None
    vllm: bool = False
    prometheus: bool = False


def emit(dep: Deployment, o: Output) -> int:
    """Check ``dep`` against every rule, then save, print, write or run it. Returns the exit status."""
    from infera.errors import KvdError, UsageError
    from infera.launch.render import FORMATS, join_files, render
    from infera.launch.rules import Context, check, parse_version
    from infera.launch.spec import save_spec as write_spec

    fmt = "json" if o.json_out else o.fmt
    if fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if o.run and fmt != "shell":
        raise UsageError("--run runs the shell format; drop --format or use --format shell")
    if o.vllm:
        _need_vllm()
    findings = check(dep, Context(vllm_version=parse_version(dep.vllm_version), use_vllm=o.vllm))
    for f in findings:
        where = f"{f.path}:{f.line}:{f.col} " if f.loc else ""
        typer.echo(f"{where}{f.code} [{f.severity}] {f.message}\n  fix: {f.fix}", err=True)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise KvdError(
            f"the deployment breaks {len(errors)} rule(s); nothing was written",
            hint="change the options or the spec as the findings say",
        )
    if o.save_spec:
        write_spec(dep, o.save_spec)
        typer.echo(f"wrote {o.save_spec}", err=True)
    files = render(dep, fmt)
    if fmt == "systemd":
        _warn_relative_exec(dep)
    if o.prometheus:
        from infera.launch.scrape import FILE, scrape_config

        files[FILE] = scrape_config(dep)
    if o.out:
        import os

        try:
            os.makedirs(o.out, exist_ok=True)
            for name, text in files.items():
                path = os.path.join(o.out, name)
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
                if name.endswith(".sh"):
                    os.chmod(path, 0o755)
                typer.echo(f"wrote {path}", err=True)
        except OSError as exc:
            raise UsageError(f"--out: cannot write {o.out}: {exc.strerror}") from None
    if o.run:
        import os

        sys.stdout.flush()
        os.execvp("bash", ["bash", "-c", files["launch.sh"], "launch.sh", o.part])
    if o.emit or not (o.out or o.save_spec):
        typer.echo(join_files(files), nl=False)
    return 0


def _warn_relative_exec(dep: Deployment) -> None:
    """systemd runs a bare name from its own PATH (/usr/local/bin, /usr/bin, ...), never a venv's."""
    for proc in dep.processes():
        exe = (proc.argv or [""])[0]
        if exe and not exe.startswith("/"):
            typer.echo(
                f"warning: {proc.name}: ExecStart runs {exe!r}, which systemd looks up in its own PATH "
                "(/usr/local/bin, /usr/bin, ...), never in a venv; give an absolute interpreter "
                "(--python PATH, or python: in the spec)",
                err=True,
            )


def _need_vllm() -> None:
    from infera.errors import UsageError
    from infera.launch.ktc import vllm_available

    if not vllm_available():
        raise UsageError(
            "--vllm: vLLM is not importable in this Python",
            hint="run kvd from the environment that has vLLM, or drop --vllm",
        )
