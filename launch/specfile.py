"""Spec files on disk: reading one for ``kvd launch --spec`` and the text ``--save-spec`` writes.

Reading is strict (:func:`infera.launch.spec.from_data` with ``strict=True``): a spec that
``kvd launch`` renders must describe a whole deployment, so unknown keys, a leg without a model or
a kv-transfer-config, legs that do not fit the ``kind`` and values an option would refuse are
one-line errors with the file and line. A file that is not UTF-8, or not YAML or JSON, says so with
the parser's own message and line.
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from infera.errors import UsageError
from infera.launch.model import Deployment, Loc
from infera.launch.spec import SpecError, dumps, from_data

# --save-spec FILE: the suffix picks the format
SPEC_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}


def load_spec(path: str) -> Deployment:
    """Read a spec file (YAML or JSON) for ``kvd launch --spec``; raises SpecError/UsageError."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UsageError(f"--spec: cannot read {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--spec: {path} is not UTF-8 text") from None
    docs = parse(text, path)
    if len(docs) != 1:
        raise SpecError("a spec file holds exactly one document", Loc(path, 1))
    return from_data(docs[0], path, strict=True)


def looks_like_json(text: str, path: str) -> bool:
    return path.lower().endswith(".json") or text.lstrip()[:1] in ("{", "[")


def parse(text: str, path: str) -> list[Any]:
    """The documents of ``text`` with positions. YAML reads JSON too; a file that fails as YAML is
    reported with YAML's problem and line, or, when it is (or looks like) JSON, with JSON's."""
    from infera.launch.lint.yamlloc import load_all

    try:
        return load_all(text)
    except yaml.YAMLError as exc:
        yaml_error = exc
    if looks_like_json(text, path):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"not valid JSON: {exc.msg[:1].lower()}{exc.msg[1:]} (column {exc.colno})",
                Loc(path, exc.lineno, exc.colno),
            ) from None
    raise SpecError(f"not valid YAML: {_yaml_problem(yaml_error)}", _yaml_loc(yaml_error, path)) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    if not problem:
        return str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    cmark, pmark = getattr(exc, "context_mark", None), getattr(exc, "problem_mark", None)
    if context and cmark is not None and pmark is not None and cmark.line != pmark.line:
        return f"{problem} ({context} from line {cmark.line + 1})"
    return str(problem)


def _yaml_loc(exc: yaml.YAMLError, path: str) -> Loc:
    mark = getattr(exc, "problem_mark", None)
    return Loc(path, mark.line + 1, mark.column + 1) if mark is not None else Loc(path, 1)


def check_save_path(path: str | None) -> None:
    """``--save-spec FILE``: named, and with a suffix that says the format (checked before anything
    is written)."""
    if path is None:
        return
    if not path.strip():
        raise UsageError("--save-spec is empty: give the spec file to write, e.g. deploy/kvd.yaml")
    if os.path.splitext(path)[1].lower() not in SPEC_SUFFIXES:
        raise UsageError(f"--save-spec: {path} does not end in {_suffixes()}: the suffix picks YAML or JSON")


def _suffixes() -> str:
    *most, last = SPEC_SUFFIXES
    return f"{', '.join(most)} or {last}"


def spec_text(dep: Deployment, path: str) -> str:
    """What ``--save-spec PATH`` writes: YAML for ``.yaml``/``.yml``, JSON for ``.json``."""
    return dumps(dep, SPEC_SUFFIXES[os.path.splitext(path)[1].lower()])
