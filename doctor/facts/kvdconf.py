"""The daemon's settings as the checks should judge them: what it runs with, or will run with.

In order, later ones winning:

1. the daemon flag table's defaults (:data:`infera.kvd.flags.FLAGS`);
2. the running daemon's command line (and the flags' environment variables in its environment),
   read from ``/proc/<pid>/`` of the host view; the daemon is the one the ``daemon`` fact reached
   (STATS names its pid), else the one serving ``--socket``, else the only one running;
3. its STATS (the arena size it really has);
4. the daemon flags given to ``kvd doctor`` itself (``--max-bytes 64G``: "I am about to run this").

Every value says where it came from, so a check can print "--max-bytes 16 GiB (daemon pid 4242)".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infera.doctor.context import Context
from infera.doctor.facts.daemon import daemon as daemon_view
from infera.doctor.facts.procs import KvdProcess, environ, kvd_daemons
from infera.kvd.flags import BY_DEST, BY_NAME, FLAGS, UNKNOWN, FlagValues, check


@dataclass
class KvdSettings:
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    process: KvdProcess | None = None
    others: list[KvdProcess] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def get(self, dest: str) -> Any:
        v = self.values.get(dest)
        return None if v is UNKNOWN else v

    def given(self, dest: str) -> bool:
        """Whether someone chose this value (the daemon's command line, STATS or kvd doctor's flags)."""
        return self.origin.get(dest, "default") != "default"

    def where(self, dest: str) -> str:
        return self.origin.get(dest, "default")

    def shown(self, dest: str, text: str | None = None) -> str:
        """``--max-bytes 1 GiB (default)``."""
        flag = BY_DEST[dest].name
        value = text if text is not None else self.get(dest)
        return f"{flag} {value} ({self.where(dest)})"


def parse_flag_words(words: list[str]) -> FlagValues:
    """The daemon flags in ``words`` (a command line after the program), as typed."""
    values: dict[str, Any] = {}
    given: set[str] = set()
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, inline = word.partition("=")
        f = BY_NAME.get(name)
        i += 1
        if f is None:
            continue
        given.add(f.name)
        if f.kind == "switch":
            values[f.dest] = True
            continue
        if eq:
            value = inline
        elif i < len(words):
            value = words[i]
            i += 1
        else:
            continue
        if f.kind == "list":
            values.setdefault(f.dest, []).append(value)
        else:
            values[f.dest] = value
    return FlagValues(values, frozenset(given))


def settings(ctx: Context) -> KvdSettings:
    return ctx.memo("kvdconf", _settings)


def _pick(ctx: Context, procs: list[KvdProcess]) -> KvdProcess | None:
    view = daemon_view(ctx)
    pid = (view.stats or {}).get("pid")
    for p in procs:
        if p.pid == pid:
            return p
    sock = ctx.options.socket
    if sock:
        for p in procs:
            if parse_flag_words(p.flags).values.get("socket") == sock:
                return p
        if ctx.options.socket_explicit:
            return None  # the daemon asked about is not among those running
    return procs[0] if len(procs) == 1 else None


def _settings(ctx: Context) -> KvdSettings:
    out = KvdSettings()
    defaults = check(FlagValues(), together=False).values
    out.values.update(defaults)
    procs = kvd_daemons(ctx)
    proc = _pick(ctx, procs)
    out.process = proc
    out.others = [p for p in procs if p is not proc]
    if proc is not None:
        typed = parse_flag_words(proc.flags)
        raw = dict(typed.values)
        env = environ(ctx, proc.pid) or {}
        for f in FLAGS:
            if f.dest not in raw and f.env and env.get(f.env):
                raw[f.dest] = env[f.env]
        checked = check(FlagValues(raw, typed.given), together=False)
        out.problems += [p.message for p in checked.problems]
        for dest in raw:
            out.values[dest] = checked.values.get(dest)
            out.origin[dest] = proc.label
    stats = daemon_view(ctx).stats
    if stats and isinstance(stats.get("arena_bytes_capacity"), int):
        out.values["max_bytes"] = stats["arena_bytes_capacity"]
        out.origin["max_bytes"] = f"daemon STATS at {daemon_view(ctx).socket}"
    mine = ctx.options.daemon_flags
    if mine:
        checked = check(FlagValues(mine, frozenset(BY_DEST[d].name for d in mine)), together=False)
        out.problems += [p.message for p in checked.problems]
        for dest in mine:
            out.values[dest] = checked.values.get(dest)
            out.origin[dest] = f"kvd doctor {BY_DEST[dest].name}"
    return out
