"""The rule registry: every rule has a stable code, a name, a default severity, a fix and a docs page.

Codes are ``KVD`` plus three digits; the hundreds group the topic (1 kv-transfer-config, 2 prefill/
decode, 3 hashing and chunk keys, 4 engine-to-daemon wiring, 5 the daemon, 6 containers; 000 is a
file that could not be parsed). A code never changes meaning once released. A rule's docstring is its
docs page (``docs/rules/<CODE>.md`` is generated from it), so code and docs cannot drift apart; the
right configurations several pages show are written once, in :mod:`infera.launch.rules.examples`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from infera.launch.model import Deployment, Loc
from infera.launch.rules.examples import expand


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass
class Hit:
    """What a check reports: a message at a place; severity and fix default to the rule's."""

    message: str
    loc: Loc | None
    severity: Severity | None = None
    fix: str | None = None


@dataclass
class Context:
    """Facts a rule may need that are not in the files: the target vLLM version, whether to import vLLM."""

    vllm_version: tuple[int, int] | None = None
    use_vllm: bool = False
    notes: list[str] = field(default_factory=list)


CheckFn = Callable[[Deployment, Context], Iterable[Hit]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    summary: str
    fix: str
    doc: str
    check: CheckFn

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": str(self.severity),
            "summary": self.summary,
            "fix": self.fix,
            "docs": f"docs/rules/{self.code}.md",
        }


@dataclass
class Finding:
    code: str
    name: str
    severity: Severity
    message: str
    fix: str
    loc: Loc | None

    @property
    def path(self) -> str:
        return self.loc.path if self.loc else "-"

    @property
    def line(self) -> int:
        return self.loc.line if self.loc else 1

    @property
    def col(self) -> int:
        return self.loc.col if self.loc else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": str(self.severity),
            "message": self.message,
            "fix": self.fix,
            "filename": self.path,
            "line": self.line,
            "column": self.col,
            "docs": f"docs/rules/{self.code}.md",
        }


REGISTRY: dict[str, Rule] = {}
_CODE_RE = re.compile(r"^KVD\d{3}$")


def rule(code: str, name: str, severity: Severity, summary: str, fix: str) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as rule ``code``; its docstring is the rule's docs page (``{{NAME}}`` lines:
    :data:`~infera.launch.rules.examples.EXAMPLES`)."""
    if not _CODE_RE.match(code):
        raise ValueError(f"bad rule code {code!r}")

    def deco(fn: CheckFn) -> CheckFn:
        if code in REGISTRY or any(r.name == name for r in REGISTRY.values()):
            raise ValueError(f"duplicate rule {code} {name}")
        doc = expand(inspect.cleandoc(fn.__doc__ or ""))
        REGISTRY[code] = Rule(code, name, severity, summary, fix, doc, fn)
        return fn

    return deco


def lookup(token: str) -> Rule | None:
    """A rule by code (``KVD301``) or name (``hash-seed-mismatch``)."""
    tok = token.strip()
    if tok.upper() in REGISTRY:
        return REGISTRY[tok.upper()]
    for r in REGISTRY.values():
        if r.name == tok.lower():
            return r
    return None


def make_finding(r: Rule, hit: Hit) -> Finding:
    return Finding(r.code, r.name, hit.severity or r.severity, hit.message, hit.fix or r.fix, hit.loc)
