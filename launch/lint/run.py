"""``kvd lint`` behind the command line: read the files, run the rules, print, pick the exit status."""

from __future__ import annotations

import os
import sys

import typer

from infera.errors import UsageError
from infera.launch.ktc import vllm_available


def _codes(text: str | None, flag: str) -> set[str] | None:
    from infera.launch.rules import lookup

    if text is None:
        return None
    out = set()
    for tok in text.split(","):
        if not tok.strip():
            continue
        r = lookup(tok)
        if r is None:
            raise UsageError(
                f"{flag}: unknown rule {tok.strip()!r}", hint="`kvd lint --list-rules` lists them"
            )
        out.add(r.code)
    return out


def run_lint(
    files: list[str],
    fmt: str,
    json_out: bool,
    ftype: str | None,
    stdin_filename: str,
    together: bool,
    select: str | None,
    ignore: str | None,
    vllm_version: str | None,
    vllm: bool,
    list_rules: bool,
    explain: str | None,
) -> int:
    from infera.launch.lint import TYPES, decode, lint_sources
    from infera.launch.lint.report import OUTPUT_FORMATS, render
    from infera.launch.rules import Context, all_rules, lookup
    from infera.launch.values import vllm_version as parse_vllm_version

    if list_rules:
        rules = all_rules()
        if json_out or fmt == "json":
            import json

            typer.echo(json.dumps([r.to_dict() for r in rules], indent=2))
        else:
            for r in rules:
                typer.echo(f"{r.code}  {r.name:<34} {r.severity:<8} {r.summary}")
        return 0
    if explain:
        found = lookup(explain)
        if found is None:
            raise UsageError(
                f"--explain: unknown rule {explain!r}", hint="`kvd lint --list-rules` lists them"
            )
        typer.echo(f"# {found.code} {found.name} ({found.severity})\n\n{found.summary}\n\n{found.doc}")
        return 0
    fmt = "json" if json_out else fmt
    if fmt not in OUTPUT_FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(OUTPUT_FORMATS)}")
    if ftype is not None and ftype not in TYPES:
        raise UsageError(f"--type: {ftype!r} is not one of {', '.join(TYPES)}")
    if not files:
        raise UsageError("no files to check", hint="pass files, or '-' to read stdin")
    version = parse_vllm_version(vllm_version)  # the parser kvd launch uses
    if vllm and not vllm_available():
        raise UsageError(
            "--vllm: vLLM is not importable in this Python",
            hint="run kvd from the environment that has vLLM, or drop --vllm",
        )
    sources = []
    for path in _expand(files):
        if path == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            data = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
            sources.append(decode(stdin_filename, data, ftype or ""))
            continue
        try:
            with open(path, "rb") as fh:
                sources.append(decode(path, fh.read(), ftype or ""))
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    result = lint_sources(
        sources,
        Context(vllm_version=version, use_vllm=vllm),
        together=together,
        select=_codes(select, "--select"),
        ignore=_codes(ignore, "--ignore") or set(),
    )
    typer.echo(render(result, fmt), nl=False)
    return 1 if result.errors else 0


LINTABLE = (".sh", ".bash", ".service", ".env", ".yaml", ".yml", ".json")


def _expand(paths: list[str]) -> list[str]:
    """Files as given; a directory becomes the lintable files under it (hidden entries skipped), and a
    directory with none is a usage error: a wrong path in CI must not pass as "no problems"."""
    out: list[str] = []
    for path in paths:
        if path != "-" and os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [
                    os.path.join(root, n)
                    for n in sorted(names)
                    if n.endswith(LINTABLE) and not n.startswith(".")
                ]
            if not found:
                raise UsageError(
                    f"nothing lintable under {path}: no {' '.join('*' + ext for ext in LINTABLE)} files"
                    " (hidden ones skipped)"
                )
            out += found
        else:
            out.append(path)
    return out
