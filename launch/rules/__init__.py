"""The rules ``kvd launch`` guarantees and ``kvd lint`` checks, run over one :class:`Deployment`.

Usage from another tool::

    from infera.launch.rules import check, Context
    findings = check(deployment, Context(vllm_version=(0, 32)))
"""

from __future__ import annotations

from collections.abc import Iterable

from infera.launch.model import Deployment
from infera.launch.rules import container, daemon, gpudirect, keys, ktc, parse, pd, router, wiring  # noqa: F401  (registers rules)
from infera.launch.rules.registry import (
    REGISTRY,
    Context,
    Finding,
    Hit,
    Rule,
    Severity,
    lookup,
    make_finding,
)
from infera.versions import major_minor as parse_version

__all__ = [
    "REGISTRY",
    "Context",
    "Finding",
    "Hit",
    "Rule",
    "Severity",
    "all_rules",
    "check",
    "lookup",
    "parse_version",
]


def all_rules() -> list[Rule]:
    return [REGISTRY[c] for c in sorted(REGISTRY)]


def check(
    dep: Deployment,
    ctx: Context | None = None,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
) -> list[Finding]:
    """Run every rule (or the ``select``ed ones, minus ``ignore``) and return the findings in file order."""
    ctx = ctx or Context()
    chosen = set(select) if select is not None else set(REGISTRY)
    chosen -= set(ignore)
    out: list[Finding] = []
    seen: set[tuple[str, str, int, int, str]] = set()
    for r in all_rules():
        if r.code not in chosen:
            continue
        for hit in r.check(dep, ctx):
            f = make_finding(r, hit)
            key = (f.code, f.path, f.line, f.col, f.message)
            if key not in seen:
                seen.add(key)
                out.append(f)
    out.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    return out
