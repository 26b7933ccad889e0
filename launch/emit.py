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
    force: bool = False
    given: frozenset[str] = frozenset()  # the options typed on the command line

    def check(self) -> str:
        """Refuse options that contradict each other or say nothing; returns the format."""
        from infera.errors import UsageError
        from infera.launch.render import FORMATS
        from infera.launch.specfile import check_save_path

        fmt = "json" if self.json_out else self.fmt
        if self.json_out and "--format" in self.given and self.fmt != "json":
            raise UsageError(f"--json is --format json, but --format {self.fmt} is given too; keep one")
        if fmt not in FORMATS:
            raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
        if self.run and fmt != "shell":
            raise UsageError("--run runs the shell format; drop --format or use --format shell")
        if "--part" in self.given and not self.run:
            raise UsageError("--part picks what --run starts; add --run, or drop --part")
        if self.force and self.out is None and self.save_spec is None:
            raise UsageError("--force lets --out and --save-spec replace files; it does nothing without them")
        if self.out is not None and not self.out.strip():
            raise UsageError("--out is empty: give the directory to write the files into")
        check_save_path(self.save_spec)
        return fmt


def emit(dep: Deployment, o: Output) -> int:
    """Check ``dep`` against every rule, then save, print, write or run it. Returns the exit status."""
    from infera.errors import KvdError
    from infera.launch import values
    from infera.launch.render import join_files, render
    from infera.launch.rules import Context, check
    from infera.launch.specfile import spec_text

    fmt = o.check()
    if o.vllm:
        _need_vllm()
    version = values.vllm_version(dep.vllm_version)
    findings = check(dep, Context(vllm_version=version, use_vllm=o.vllm))
    for f in findings:
        where = f"{f.path}:{f.line}:{f.col} " if f.loc else ""
        typer.echo(f"{where}{f.code} [{f.severity}] {f.message}\n  fix: {f.fix}", err=True)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise KvdError(
            f"the deployment breaks {len(errors)} rule(s); nothing was written",
            hint="change the options or the spec as the findings say",
        )
    files = render(dep, fmt)
    if fmt == "systemd":
        _warn_relative_exec(dep)
    if o.prometheus:
        from infera.launch.scrape import FILE, scrape_config

        files[FILE] = scrape_config(dep)
    writes: list[tuple[str, str, str]] = []  # (flag, path, text): checked together, then written
    if o.save_spec:
        writes.append(("--save-spec", o.save_spec, spec_text(dep, o.save_spec)))
    if o.out:
        import os

        writes += [("--out", os.path.join(o.out, name), text) for name, text in files.items()]
    write_files(writes, o.out, o.force)
    if o.run:
        import os

        sys.stdout.flush()
        os.execvp("bash", ["bash", "-c", files["launch.sh"], "launch.sh", o.part])
    if o.emit or not (o.out or o.save_spec):
        typer.echo(join_files(files), nl=False)
    return 0


def write_files(writes: list[tuple[str, str, str]], out: str | None, force: bool) -> None:
    """Write each (flag, path, text). Nothing is written unless every file can be: ``out`` must be a
    directory (made when missing), and a file that holds something else is replaced only with
    ``force``; one that already holds the same text is left as it is."""
    import os

    from infera.errors import UsageError

    if out and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out: {out} is not a directory")
    for flag, path, text in writes:
        if not force and os.path.lexists(path) and _content(path) != text:
            raise UsageError(f"{flag}: {path} already exists with other content; pass --force to replace it")
    for flag, path, text in writes:
        try:
            if flag == "--out":
                os.makedirs(os.path.dirname(path), exist_ok=True)
            if _content(path) != text:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
                typer.echo(f"wrote {path}", err=True)
            else:
                typer.echo(f"unchanged {path}", err=True)
            if path.endswith(".sh"):
                os.chmod(path, 0o755)
        except OSError as exc:
            raise UsageError(f"{flag}: cannot write {path}: {exc.strerror}") from None


def _content(path: str) -> str | None:
    """The text of ``path``; None when it is missing or cannot be read as text."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


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
