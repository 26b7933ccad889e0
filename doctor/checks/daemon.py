"""The kvd daemon: reachable, which version, what its counters say.

``misses_total`` counts loads of chunks a lookup had promised; the scheduler and worker then
disagreed or the chunk went away in between. The likely causes are listed with the ones the
counters support first.
"""

from __future__ import annotations

from typing import Any

from infera import __version__
from infera.doctor.context import Context
from infera.doctor.facts.daemon import daemon as daemon_view
from infera.doctor.facts.daemon import engine_clients
from infera.doctor.model import CheckResult, Evidence, Status, fail, skip, warn, worst
from infera.doctor.registry import check
from infera.units import format_size

COUNTERS = ("sets_total", "gets_total", "hits_total", "misses_total", "evictions_total", "expired_total")


@check("daemon", "kvd daemon reachable and counting", "daemon", order=10)
def daemon(ctx: Context) -> CheckResult:
    view = daemon_view(ctx)
    if view.stats is None:
        ev = [Evidence(view.socket or "(no socket)", view.error or "", "daemon")]
        if view.absent:
            return skip(
                f"no daemon at {view.socket or 'the default socket'} (pass --socket PATH to include one)"
                if view.socket
                else view.error or "no daemon socket",
                ev,
            )
        summary = f"cannot reach kvd at {view.socket}: {view.error}"
        fix = view.hint or "start it (`kvd serve --socket PATH`) or pass the right --socket"
        return fail(summary, ev, fix=fix) if view.explicit else warn(summary, ev, fix=fix)
    s = view.stats
    ev = [Evidence(f"daemon {view.socket}", f"{k} {s.get(k, 0)}", "daemon") for k in COUNTERS]
    ev.append(
        Evidence(
            f"daemon {view.socket}",
            f"arena {format_size(s.get('arena_bytes_used', 0))} of {format_size(s.get('arena_bytes_capacity', 0))}, "
            f"{s.get('chunks', 0)} chunks, {s.get('clients_connected', 0)} clients",
            "daemon",
        )
    )
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    version = str(s.get("version", "?"))
    if version != __version__:
        findings.append((Status.WARN, f"daemon {version} differs from this kvd {__version__}"))
        fixes.append("run the same infera-kvd version for the daemon, the engines and the tools")
    for w in s.get("warnings", []):
        ev.append(Evidence(f"daemon {view.socket}", f"warning: {w}", "daemon"))
        findings.append((Status.WARN, f"daemon warns: {w}"))
    long = (s.get("tiers") or {}).get("long")
    if long:
        ev.append(Evidence(f"daemon {view.socket}", _long_text(long), "daemon"))
        state = long.get("state")
        if state in ("degraded", "disconnected"):
            findings.append(
                (Status.WARN, f"long tier {long.get('backend')} is {state}: {long.get('last_error') or ''}")
            )
            fixes.append("read the daemon log for the long tier's last error")
    misses = int(s.get("misses_total", 0))
    details: list[str] = []
    if misses > 0:
        causes = _miss_causes(s, long)
        details.append(
            "likely causes, most supported first: " + "; ".join(f"({i}) {c}" for i, c in enumerate(causes, 1))
        )
        findings.append(
            (Status.WARN, f"misses_total {misses} with hits_total {s.get('hits_total', 0)}: {causes[0]}")
        )
        fixes.append("work through the likely causes listed above, starting with hash-settings")
    gd = [
        c
        for c in engine_clients(s)
        if any(p in str(c.get("data_path", "")) for p in ("gpu-direct", "hipfile", "cufile"))
    ]
    if gd:
        details.append(
            "engines on GPU-direct read and write chunk files themselves: the daemon counts their file "
            "reads in gets_direct_total (not as misses), indexes their files (ADOPT), and shows each "
            "engine's own gd_* counters per client"
        )
    for c in engine_clients(s):
        if c.get("fallback"):
            ev.append(
                Evidence(
                    f"daemon {view.socket}",
                    f"client pid {c.get('pid')} ({c.get('role') or '?'}) fell back to "
                    f"{c.get('data_path') or '?'}: {c.get('fallback_reason') or 'no reason given'}",
                    "daemon",
                )
            )
            findings.append(
                (Status.WARN, f"{c.get('role') or 'a client'} runs on a fallback path ({c.get('data_path')})")
            )
            fixes.append("see docs/gpu.md for each fallback reason and its fix")
    status = worst((st for st, _ in findings), Status.OK)
    clients = _plural(int(s.get("clients_connected", 0)), "client")
    summary = (
        f"kvd {version} at {view.socket}: up {s.get('uptime_s', 0)} s, {clients}; "
        f"sets {s.get('sets_total', 0)} gets {s.get('gets_total', 0)} hits {s.get('hits_total', 0)} misses {misses}"
    )
    problems = [t for st, t in findings if st is not Status.OK]
    if problems:
        summary += "; " + "; ".join(problems)
    return CheckResult(status, summary, ev, fix="; ".join(dict.fromkeys(fixes)) or None, details=details)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _long_text(long: dict[str, Any]) -> str:
    keys = ("backend", "state", "chunks", "corrupt_chunks", "failed_writes", "dropped_writes")
    return "long tier " + ", ".join(f"{k} {long.get(k)}" for k in keys if k in long)


def _miss_causes(s: dict[str, Any], long: dict[str, Any] | None) -> list[str]:
    supported: list[str] = []
    other: list[str] = []
    if s.get("warnings"):
        supported.append("engines declare different hash settings (the daemon warns; see hash-settings)")
    else:
        other.append(
            "the scheduler and worker, or two engines, hash differently: PYTHONHASHSEED (see hash-settings)"
        )
    fps = {c.get("chunk_tokens") for c in engine_clients(s) if c.get("chunk_tokens")}
    (supported if len(fps) > 1 else other).append(
        "INFERA_KVD_CHUNK_TOKENS differs between engines or between runs (see chunk-tokens)"
    )
    if int(s.get("evictions_total", 0)) > 0:
        used, cap = s.get("arena_bytes_used", 0), s.get("arena_bytes_capacity", 0) or 1
        supported.append(
            f"chunks evicted between lookup and load ({s.get('evictions_total')} evictions, arena "
            f"{100 * used // cap}% full): raise --max-bytes or add a long tier"
        )
    else:
        other.append("chunks evicted between lookup and load (no evictions counted so far)")
    if int(s.get("expired_total", 0)) > 0:
        supported.append(f"ephemeral chunks expired ({s.get('expired_total')}): raise --ephemeral-ttl")
    if long and int(long.get("corrupt_chunks", 0) or 0) > 0:
        supported.append(f"{long.get('corrupt_chunks')} corrupt long-tier chunk files were dropped")
    return supported + other
