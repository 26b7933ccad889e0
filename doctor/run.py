"""Run the selected checks; a check that raises becomes ``unknown`` instead of crashing the doctor."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from infera import __version__
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.model import CheckResult, Evidence, Finished, Status
from infera.doctor.registry import CheckSpec, select


@dataclass
class Report:
    """All results of one doctor run, in report order."""

    results: list[Finished]
    root: str
    host: str | None
    elapsed_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = {str(s): 0 for s in Status}
        for r in self.results:
            out[str(r.result.status)] += 1
        return out

    @property
    def failed(self) -> bool:
        return any(r.result.status is Status.FAIL for r in self.results)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def get(self, check_id: str) -> Finished:
        for r in self.results:
            if r.id == check_id:
                return r
        raise KeyError(check_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "checks": [r.to_json() for r in self.results],
            "summary": self.counts(),
            "doctor": {
                "version": __version__,
                "root": self.root,
                "host": self.host,
                "elapsed_s": round(self.elapsed_s, 3),
                **self.meta,
            },
        }


def run_check(spec: CheckSpec, ctx: Context) -> Finished:
    t0 = time.monotonic()
    try:
        result = spec.fn(ctx)
        if not isinstance(result, CheckResult):
            raise TypeError(f"check returned {type(result).__name__}, not CheckResult")
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result = CheckResult(
            Status.UNKNOWN,
            f"the check itself failed ({type(exc).__name__}: {exc}); this is a kvd doctor bug",
            [Evidence(f"{where.filename}:{where.lineno}", f"{type(exc).__name__}: {exc}", "internal")],
            fix="report it with the output of `kvd doctor --json --verbose`",
        )
    return Finished(spec.id, spec.title, spec.area, result, time.monotonic() - t0)


def run_doctor(options: DoctorOptions | None = None, ctx: Context | None = None) -> Report:
    """Run the checks ``options.checks`` names (all of them when empty) and collect a report."""
    ctx = ctx or Context(options)
    specs = select(ctx.options.checks)
    t0 = time.monotonic()
    results = [run_check(spec, ctx) for spec in specs]
    return Report(results, str(ctx.host.root), ctx.host.hostname(), time.monotonic() - t0)
