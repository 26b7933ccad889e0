"""``kvd lint`` output: text for people, JSON for scripts, SARIF for code scanning, GitHub annotations."""

from __future__ import annotations

import json
from typing import Any

from infera import __version__
from infera.launch.lint import LintResult
from infera.launch.rules import REGISTRY

OUTPUT_FORMATS = ("text", "json", "sarif", "github")


def text(result: LintResult) -> str:
    """``file:line:col RULE [severity] message`` and an indented ``fix:`` line per finding, then a summary."""
    lines = []
    for f in result.findings:
        lines.append(f"{f.path}:{f.line}:{f.col} {f.code} [{f.severity}] {f.message}")
        lines.append(f"  fix: {f.fix}")
    n = len(result.findings)
    files = f"{result.files} file{'s' if result.files != 1 else ''}"
    if n == 0:
        lines.append(f"kvd lint: {files} checked, no problems")
    else:
        lines.append(
            f"kvd lint: {files} checked, {result.errors} error{'s' if result.errors != 1 else ''}, "
            f"{result.warnings} warning{'s' if result.warnings != 1 else ''}"
        )
    if result.suppressed:
        lines[-1] += f" ({result.suppressed} suppressed)"
    return "\n".join(lines) + "\n"


def as_json(result: LintResult) -> str:
    data = {
        "findings": [f.to_dict() for f in result.findings],
        "summary": {
            "files": result.files,
            "errors": result.errors,
            "warnings": result.warnings,
            "suppressed": result.suppressed,
        },
    }
    return json.dumps(data, indent=2) + "\n"


def sarif(result: LintResult) -> str:
    """SARIF 2.1.0, one run, every rule described so code-scanning UIs can show the fix."""
    used = sorted({f.code for f in result.findings} | set(REGISTRY))
    rules: list[dict[str, Any]] = []
    index = {}
    for i, code in enumerate(used):
        r = REGISTRY[code]
        index[code] = i
        rules.append(
            {
                "id": r.code,
                "name": r.name,
                "shortDescription": {"text": r.summary},
                "help": {"text": r.fix, "markdown": r.doc},
                "defaultConfiguration": {"level": "error" if r.severity == "error" else "warning"},
                "properties": {"docs": f"docs/rules/{r.code}.md"},
            }
        )
    results = []
    for f in result.findings:
        results.append(
            {
                "ruleId": f.code,
                "ruleIndex": index[f.code],
                "level": "error" if f.severity == "error" else "warning",
                "message": {"text": f"{f.message}. Fix: {f.fix}"},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": f.path},
                            "region": {"startLine": f.line, "startColumn": f.col},
                        }
                    }
                ],
            }
        )
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "kvd lint", "version": __version__, "rules": rules}},
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def _gh_escape(text: str, prop: bool = False) -> str:
    out = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        out = out.replace(":", "%3A").replace(",", "%2C")
    return out


def github(result: LintResult) -> str:
    """GitHub Actions workflow commands: one ``::error``/``::warning`` annotation per finding."""
    lines = []
    for f in result.findings:
        props = f"file={_gh_escape(f.path, True)},line={f.line},col={f.col},title={_gh_escape(f.code + ' ' + f.name, True)}"
        lines.append(f"::{f.severity} {props}::{_gh_escape(f.message + '. Fix: ' + f.fix)}")
    return "\n".join(lines) + ("\n" if lines else "")


def render(result: LintResult, fmt: str) -> str:
    return {"text": text, "json": as_json, "sarif": sarif, "github": github}[fmt](result)
