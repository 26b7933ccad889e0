"""The doctor's text report: grouped by area, one symbol per check, the fix under every problem."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import TextIO

import typer

from infera import __version__
from infera.doctor.model import Finished, Status
from infera.doctor.registry import AREAS
from infera.doctor.run import Report

SYMBOLS = {Status.OK: "✓", Status.WARN: "!", Status.FAIL: "✗", Status.UNKNOWN: "?", Status.SKIP: "-"}
ASCII = {Status.OK: "ok", Status.WARN: "!!", Status.FAIL: "XX", Status.UNKNOWN: "??", Status.SKIP: "--"}
COLORS = {
    Status.OK: "green",
    Status.WARN: "yellow",
    Status.FAIL: "red",
    Status.UNKNOWN: "cyan",
    Status.SKIP: "bright_black",
}


class Style:
    def __init__(self, stream: TextIO, color: bool | None = None) -> None:
        enc = (getattr(stream, "encoding", None) or "ascii").lower()
        self.unicode = "utf" in enc
        if color is None:
            color = stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        self.color = color

    def symbol(self, s: Status) -> str:
        sym = SYMBOLS[s] if self.unicode else ASCII[s]
        return typer.style(sym, fg=COLORS[s], bold=True) if self.color else sym

    def bold(self, text: str) -> str:
        return typer.style(text, bold=True) if self.color else text

    @property
    def dot(self) -> str:
        return "·" if self.unicode else "-"

    def dim(self, text: str) -> str:
        return typer.style(text, dim=True) if self.color else text


def render_text(
    report: Report, *, verbose: bool = False, stream: TextIO | None = None, color: bool | None = None
) -> str:
    stream = stream or sys.stdout
    st = Style(stream, color)
    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    idw = max((len(r.id) for r in report.results), default=10) + 2
    out: list[str] = [
        st.bold(f"kvd doctor {__version__}")
        + f" on {report.host or '?'}"
        + (f" (root {report.root})" if report.root != "/" else ""),
    ]
    area = None
    for r in report.results:
        if r.area != area:
            area = r.area
            out.append("")
            out.append(st.bold(AREAS.get(area, area.title())))
        out.extend(_check_lines(r, st, verbose, width, idw))
    counts = report.counts()
    out.append("")
    out.append(
        "Summary: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + f" ({report.elapsed_s:.2f} s)"
    )
    out.extend(_footer(report, st, verbose))
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    ) or [first.rstrip()]


def _check_lines(r: Finished, st: Style, verbose: bool, width: int, idw: int) -> list[str]:
    res = r.result
    pad = " " * (4 + idw)
    head = f"  {st.symbol(res.status)} {r.id:<{idw}}"
    visible = len(f"  x {r.id:<{idw}}")
    lines = _wrap(res.summary, width, " " * visible, pad)
    lines[0] = head + lines[0][visible:]
    problem = res.status in (Status.WARN, Status.FAIL, Status.UNKNOWN)
    if verbose or problem:
        for d in res.details:
            lines.extend(_wrap(d, width, pad + st.dot + " ", pad + "  "))
    if res.fix and problem:
        lines.extend(_wrap(res.fix, width, pad + st.bold("fix: "), pad + "     "))
    if verbose:
        lines.append(
            pad + st.dim(f"{r.title} {st.dot} {r.elapsed_s * 1000:.0f} ms {st.dot} docs/doctor/{r.id}.md")
        )
        for e in res.evidence:
            lines.extend(_wrap(f"[{e.kind}] {e.source}: {e.value}", width, pad + "  ", pad + "    "))
    return lines


def _footer(report: Report, st: Style, verbose: bool) -> list[str]:
    by: dict[Status, list[str]] = {s: [] for s in Status}
    for r in report.results:
        by[r.result.status].append(r.id)
    out = []
    if by[Status.FAIL]:
        out.append(f"{st.symbol(Status.FAIL)} {len(by[Status.FAIL])} failed: {', '.join(by[Status.FAIL])}")
    if by[Status.WARN]:
        out.append(
            f"{st.symbol(Status.WARN)} {len(by[Status.WARN])} to look at: {', '.join(by[Status.WARN])}"
        )
    if by[Status.UNKNOWN]:
        out.append(
            f"{st.symbol(Status.UNKNOWN)} {len(by[Status.UNKNOWN])} could not be checked here: "
            f"{', '.join(by[Status.UNKNOWN])}"
        )
    if not out:
        out.append(f"{st.symbol(Status.OK)} No problems found.")
    if not verbose:
        out.append(st.dim("Run with --verbose for the evidence behind each line, --json for scripts."))
    return out
