"""``kvd lint``: read what people deploy back into the deployment model and run the rules on it.

File types: ``shell`` (scripts), ``env`` (``KEY=value`` files), ``systemd`` (units), ``yaml`` (a
Kubernetes manifest, a compose file or a spec, told apart by content) and ``json`` (a spec). The type
comes from ``--type``, else the file name, else the content.

Suppressions: ``# kvd: ignore[KVD301]`` (codes or names, comma-separated) at the end of a line of the
command a finding is on, or alone on the line just above it; ``# kvd: ignore-file[KVD601]`` anywhere
in a file silences a rule for the whole file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import yaml

from infera.launch.model import Deployment, Loc
from infera.launch.rules import REGISTRY, Context, Finding, check, lookup
from infera.launch.rules.registry import Hit, Severity, make_finding

TYPES = ("shell", "env", "systemd", "yaml", "json")
_IGNORE_RE = re.compile(r"#\s*kvd:\s*ignore\[([^\]]*)\]")
_IGNORE_FILE_RE = re.compile(r"#\s*kvd:\s*ignore-file\[([^\]]*)\]")


@dataclass
class Source:
    path: str
    text: str
    ftype: str = ""
    #: why the file is not text (set by :func:`decode`); such a file is reported, not parsed
    not_text: str = ""


def decode(path: str, data: bytes, ftype: str = "") -> Source:
    """A file's bytes as a :class:`Source`. Bytes that are not UTF-8, or hold a NUL, are no script,
    unit, manifest or env file: :func:`read_source` reports them instead of parsing the noise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"byte {exc.start} is not UTF-8"
        return Source(path, data.decode("utf-8", "replace"), ftype, not_text=why)
    if "\x00" in text:
        return Source(path, text, ftype, not_text=f"byte {data.index(0)} is NUL")
    return Source(path, text, ftype)


@dataclass
class Suppressions:
    by_line: dict[int, set[str]] = field(default_factory=dict)
    above: dict[int, set[str]] = field(default_factory=dict)  # comment-only line N applies to line N+1
    whole_file: set[str] = field(default_factory=set)

    def silences(self, f: Finding) -> bool:
        if f.code in self.whole_file:
            return True
        loc = f.loc
        lines = loc.lines() if loc else range(1, 2)
        if any(f.code in self.by_line.get(n, ()) for n in lines):
            return True
        first = lines.start
        return f.code in self.above.get(first - 1, ())


def _codes(text: str) -> set[str]:
    out = set()
    for tok in text.split(","):
        r = lookup(tok)
        if r is not None:
            out.add(r.code)
    return out


def suppressions(text: str) -> Suppressions:
    sup = Suppressions()
    for n, line in enumerate(text.splitlines(), 1):
        for m in _IGNORE_FILE_RE.finditer(line):
            sup.whole_file |= _codes(m.group(1))
        for m in _IGNORE_RE.finditer(line):
            codes = _codes(m.group(1))
            if line.lstrip().startswith("#"):
                sup.above.setdefault(n, set()).update(codes)
            else:
                sup.by_line.setdefault(n, set()).update(codes)
    # a run of comment-only lines above a command all apply to it
    for n in sorted(sup.above, reverse=True):
        if n + 1 in sup.above:
            sup.above[n] |= sup.above[n + 1]
    return sup


def detect(path: str, text: str) -> str:
    name = os.path.basename(path).lower()
    ext = os.path.splitext(name)[1]
    if ext in (".sh", ".bash"):
        return "shell"
    if ext in (".service",) or name.endswith(".service.in"):
        return "systemd"
    if ext == ".env" or name == ".env" or name.endswith((".env.example", "env.list")):
        return "env"
    if ext in (".yaml", ".yml"):
        return "yaml"
    if ext == ".json":
        return "json"
    head = text.lstrip()
    if head.startswith("{"):
        return "json"
    if re.search(r"^\[(Unit|Service|Install)\]\s*$", text, re.M):
        return "systemd"
    if head.startswith("#!"):
        return "shell"
    if re.search(r"^(apiVersion|kind|services|legs)\s*:", text, re.M) or head.startswith("---"):
        return "yaml"
    if (
        text.strip()
        and all(
            re.match(r"^\s*(#.*|(export\s+)?[A-Za-z_][A-Za-z0-9_]*=.*)?$", ln) for ln in text.splitlines()
        )
        and "python" not in text
    ):
        return "env"
    return "shell"


def _parse_error(
    path: str, line: int, col: int, message: str, severity: Severity | None = None, fix: str | None = None
) -> Finding:
    return make_finding(REGISTRY["KVD000"], Hit(message, Loc(path, max(line, 1), max(col, 1)), severity, fix))


_NOTHING_FIX = (
    "Lint the file you deploy: this is usually a wrong path, or the output of a step that failed "
    "(`kubectl kustomize ... | kvd lint -`)."
)


_PART_RE = re.compile(r"^# ==> (\S+) <==$", re.M)


_MAY_BE_EMPTY = ("shell", "env")  # an empty script or env file is valid; empty YAML, JSON or a unit is not


def read_source(src: Source) -> tuple[Deployment, list[Finding]]:
    """The deployment a file describes, or a KVD000 finding when it cannot be parsed.

    Text that ``kvd launch --emit`` joined from several files (``# ==> NAME <==`` before each) is read
    part by part, each with the type its name says, as one deployment; line numbers stay the file's.
    A file that is not text, or is empty, is one KVD000 finding: there is nothing in it to check.
    """
    if src.not_text:
        why = (
            f"not a text file ({src.not_text}): kvd lint reads UTF-8 scripts, units, env files, YAML and JSON"
        )
        return Deployment(), [_parse_error(src.path, 1, 1, why, fix=_NOTHING_FIX)]
    if not src.text.strip() and (
        src.path == "-" or (src.ftype or detect(src.path, src.text)) not in _MAY_BE_EMPTY
    ):
        return Deployment(), [_parse_error(src.path, 1, 1, "empty file: nothing to check", fix=_NOTHING_FIX)]
    marks = list(_PART_RE.finditer(src.text))
    if marks and not src.ftype and marks[0].start() == 0:
        dep, errors = Deployment(), list[Finding]()
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(src.text)
            pad = "\n" * src.text.count("\n", 0, m.end())
            part = Source(
                src.path, pad + src.text[m.end() : end], detect(m.group(1), src.text[m.end() : end])
            )
            d, e = _read_one(part, m.group(1))
            for proc in d.processes():
                if proc.name == os.path.basename(src.path):
                    proc.name = m.group(1)
            dep, errors = dep.merge(d), errors + e
        return dep, errors
    return _read_one(src)


def _read_one(src: Source, name: str = "") -> tuple[Deployment, list[Finding]]:
    """One file (or one part of an emitted bundle, called ``name``) as the type it has or looks like."""
    from infera.launch.lint.shtok import ShellSyntaxError

    ftype = src.ftype or detect(src.path, src.text)
    found: list[Finding] = []
    try:
        if ftype == "shell":
            from infera.launch.lint.shell import read_shell

            return read_shell(src.text, src.path), []
        if ftype == "env":
            from infera.launch.lint.units import read_env_file

            return read_env_file(src.text, src.path), []
        if ftype == "systemd":
            from infera.launch.lint.unitcheck import check_unit
            from infera.launch.lint.units import read_unit

            problems = check_unit(src.text, name or os.path.basename(src.path))
            found = [
                _parse_error(src.path, p.line, p.col, p.message, None if p.error else Severity.WARNING)
                for p in problems
            ]
            if any(p.fatal for p in problems):
                return Deployment(), found
            return read_unit(src.text, src.path), found
        return _read_structured(src, ftype)
    except ShellSyntaxError as exc:
        line = src.text.count("\n", 0, exc.pos) + 1
        col = exc.pos - (src.text.rfind("\n", 0, exc.pos) + 1) + 1
        return Deployment(), [*found, _parse_error(src.path, line, col, exc.message)]


def _read_structured(src: Source, ftype: str) -> tuple[Deployment, list[Finding]]:
    from infera.launch.lint.manifests import read_compose, read_k8s
    from infera.launch.lint.yamlloc import load_all
    from infera.launch.spec import SpecError, from_data

    try:
        docs = load_all(src.text)
    except yaml.YAMLError as exc:
        if ftype == "json":
            import json

            try:
                docs = [json.loads(src.text)]
            except json.JSONDecodeError as jexc:
                return Deployment(), [
                    _parse_error(src.path, jexc.lineno, jexc.colno, f"invalid JSON: {jexc.msg}")
                ]
        else:
            mark = getattr(exc, "problem_mark", None)
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            return Deployment(), [_parse_error(src.path, line, col, f"invalid YAML: {problem}")]
    dep = Deployment()
    k8s = [d for d in docs if isinstance(d, dict) and "apiVersion" in d and "kind" in d]
    if k8s:
        dep = dep.merge(read_k8s(k8s, src.path, src.text))
    for d in docs:
        if not isinstance(d, dict) or any(d is x for x in k8s):
            continue
        if "legs" in d:
            try:
                dep = dep.merge(from_data(d, src.path))
            except SpecError as exc:
                loc = exc.loc or Loc(src.path, 1)
                return Deployment(), [_parse_error(src.path, loc.line, loc.col, f"spec: {exc.detail}")]
        elif isinstance(d.get("services"), dict):
            dep = dep.merge(read_compose(d, src.path, src.text))
    return dep, []


@dataclass
class LintResult:
    findings: list[Finding]
    files: int
    suppressed: int = 0

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.severity == "warning")


def lint_sources(
    sources: Iterable[Source],
    ctx: Context | None = None,
    together: bool = False,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
) -> LintResult:
    """Lint each source on its own, or all of them as one deployment (``together``)."""
    ctx = ctx or Context()
    sources = list(sources)
    sel = set(select) if select is not None else None
    ign = set(ignore)
    findings: list[Finding] = []
    deps: list[Deployment] = []
    for src in sources:
        dep, errs = read_source(src)
        findings += [f for f in errs if (sel is None or f.code in sel) and f.code not in ign]
        deps.append(dep)
    if together and deps:
        merged = deps[0]
        for d in deps[1:]:
            merged = merged.merge(d)
        deps = [merged]
    for dep in deps:
        local = ctx
        if dep.vllm_version and ctx.vllm_version is None:
            from infera.launch.rules import parse_version

            local = Context(vllm_version=parse_version(dep.vllm_version), use_vllm=ctx.use_vllm)
        findings += check(dep, local, select=sel, ignore=ign)
    sups = {src.path: suppressions(src.text) for src in sources}
    kept = [f for f in findings if not (f.loc and f.loc.path in sups and sups[f.loc.path].silences(f))]
    kept.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    return LintResult(kept, len(sources), len(findings) - len(kept))
