"""The check registry.

A check is a function ``(ctx: Context) -> CheckResult`` decorated with :func:`check`. Every module
in :mod:`infera.doctor.checks` is imported on first use, so adding a check is adding one file
there (plus its docs page ``docs/doctor/<id>.md``).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infera.errors import UsageError

if TYPE_CHECKING:
    from infera.doctor.context import Context
    from infera.doctor.model import CheckResult

CheckFn = Callable[["Context"], "CheckResult"]
#: A check's precondition: a result when the check cannot apply here, else None.
Precondition = Callable[["Context"], "CheckResult | None"]

#: Report sections, in the order they print. A check may name an area not listed; it prints last.
AREAS: dict[str, str] = {
    "platform": "Platform",
    "memory": "Memory and limits",
    "amd": "AMD driver and AIS",
    "storage": "Storage",
    "engines": "Engines",
    "daemon": "kvd daemon",
    "pd": "Prefill/decode discovery",
    "nvidia": "NVIDIA GPUDirect Storage",
}


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: ``id`` is what ``--check`` takes and names the docs page."""

    id: str
    title: str
    area: str
    order: int
    fn: CheckFn

    @property
    def docs(self) -> str:
        return f"docs/doctor/{self.id}.md"


_REGISTRY: dict[str, CheckSpec] = {}
_loaded = False


def check(
    id: str, title: str, area: str, order: int = 50, needs: Precondition | None = None
) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check ``id``. Ids are kebab-case and unique.

    ``needs`` runs first: a result from it (a skip, say) is the check's result and ``fn`` is not run.
    """

    def deco(fn: CheckFn) -> CheckFn:
        run = fn if needs is None else _guarded(needs, fn)
        if id in _REGISTRY and getattr(_REGISTRY[id].fn, "__wrapped__", _REGISTRY[id].fn) is not fn:
            raise RuntimeError(f"doctor check {id!r} registered twice")
        _REGISTRY[id] = CheckSpec(id, title, area, order, run)
        return run

    return deco


def _guarded(needs: Precondition, fn: CheckFn) -> CheckFn:
    @functools.wraps(fn)
    def run(ctx: Context) -> CheckResult:
        early = needs(ctx)
        return fn(ctx) if early is None else early

    return run


def _load() -> None:
    global _loaded
    if _loaded:
        return
    checks = importlib.import_module("infera.doctor.checks")
    for mod in pkgutil.iter_modules(checks.__path__):
        importlib.import_module(f"{checks.__name__}.{mod.name}")
    _loaded = True


def _area_rank(area: str) -> int:
    keys = list(AREAS)
    return keys.index(area) if area in keys else len(keys)


def all_checks() -> list[CheckSpec]:
    """Every registered check in report order (area, then order within the area)."""
    _load()
    return sorted(_REGISTRY.values(), key=lambda s: (_area_rank(s.area), s.order, s.id))


def select(names: Iterable[str]) -> list[CheckSpec]:
    """The checks named by id or by area; an unknown name is a usage error listing the valid ones."""
    specs = all_checks()
    wanted = [n.strip() for n in names if n.strip()]
    if not wanted:
        return specs
    by_id = {s.id: s for s in specs}
    areas = {s.area for s in specs}
    chosen: set[str] = set()
    for name in wanted:
        key = name.lower().replace("_", "-")
        if key in by_id:
            chosen.add(key)
        elif key in areas:
            chosen.update(s.id for s in specs if s.area == key)
        else:
            raise UsageError(
                f"no doctor check named {name!r}",
                hint=f"checks: {', '.join(by_id)}; areas: {', '.join(sorted(areas))}",
            )
    return [s for s in specs if s.id in chosen]
