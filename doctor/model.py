"""What a check returns: a status, a one-line summary, the evidence it read and the next step."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """How a check came out. ``unknown`` means the doctor could not tell (and says why)."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"
    SKIP = "skip"

    @property
    def rank(self) -> int:
        """Severity order used to combine findings: a fail outranks a warn, which outranks unknown."""
        return _RANK[self]


_RANK = {Status.SKIP: 0, Status.OK: 1, Status.UNKNOWN: 2, Status.WARN: 3, Status.FAIL: 4}


@dataclass(frozen=True)
class Evidence:
    """One thing a check read, and where from (a file path, a command line, an env var, the daemon)."""

    source: str
    value: str
    kind: str = "file"

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source, "value": self.value}

    def __str__(self) -> str:
        return f"{self.source}: {self.value}" if self.value else self.source


@dataclass
class CheckResult:
    """The outcome of one check. ``fix`` is the exact next step for a warn or fail."""

    status: Status
    summary: str
    evidence: list[Evidence] = field(default_factory=list)
    fix: str | None = None
    details: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finished:
    """A check's result together with the check's identity, as reports and ``--json`` show it."""

    id: str
    title: str
    area: str
    result: CheckResult
    elapsed_s: float

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "id": self.id,
            "title": self.title,
            "area": self.area,
            "status": str(r.status),
            "summary": r.summary,
            "details": list(r.details),
            "evidence": [e.to_json() for e in r.evidence],
            "fix": r.fix,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def ok(summary: str, evidence: list[Evidence] | None = None, **kw: Any) -> CheckResult:
    return CheckResult(Status.OK, summary, evidence or [], **kw)


def warn(summary: str, evidence: list[Evidence] | None = None, **kw: Any) -> CheckResult:
    return CheckResult(Status.WARN, summary, evidence or [], **kw)


def fail(summary: str, evidence: list[Evidence] | None = None, **kw: Any) -> CheckResult:
    return CheckResult(Status.FAIL, summary, evidence or [], **kw)


def unknown(summary: str, evidence: list[Evidence] | None = None, **kw: Any) -> CheckResult:
    return CheckResult(Status.UNKNOWN, summary, evidence or [], **kw)


def skip(summary: str, evidence: list[Evidence] | None = None, **kw: Any) -> CheckResult:
    return CheckResult(Status.SKIP, summary, evidence or [], **kw)


def worst(statuses: Iterable[Status], default: Status = Status.OK) -> Status:
    """The most severe status (fail > warn > unknown > ok > skip)."""
    out: Status | None = None
    for s in statuses:
        if out is None or s.rank > out.rank:
            out = s
    return out or default


@dataclass
class Notes:
    """What a check collects on its way: evidence, findings (a status and what is wrong) and fixes."""

    evidence: list[Evidence] = field(default_factory=list)
    findings: list[tuple[Status, str]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)

    def result(self, summary: str) -> CheckResult:
        """The worst finding's status, ``summary`` followed by every problem, the fixes without repeats."""
        status = worst((s for s, _ in self.findings), Status.OK)
        problems = [t for s, t in self.findings if s is not Status.OK]
        if problems:
            summary += "; " + "; ".join(problems)
        return CheckResult(status, summary, self.evidence, fix="; ".join(dict.fromkeys(self.fixes)) or None)
