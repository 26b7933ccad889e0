"""INFERA_KVD_CHUNK_TOKENS: leave it at auto; never let engines of one model disagree.

A chunk's key covers its tokens, so engines (or runs) with different chunk sizes never hit each
other's chunks. Small fixed values make every chunk overhead-bound: auto sizes chunks to at least
128 MiB, where GPU-direct's fan-out pays off.
"""

from __future__ import annotations

from collections import defaultdict

from infera.doctor.context import Context
from infera.doctor.facts.daemon import client_label, daemon, engine_clients
from infera.doctor.facts.engines import scan
from infera.doctor.model import CheckResult, Evidence, Status, skip, worst
from infera.doctor.registry import check

ENV = "INFERA_KVD_CHUNK_TOKENS"
#: Below this many tokens a fixed chunk is small for any common model (KV of 32-320 KiB per token).
SMALL = 512


@check("chunk-tokens", "INFERA_KVD_CHUNK_TOKENS", "engines", order=20)
def chunk_tokens(ctx: Context) -> CheckResult:
    ev: list[Evidence] = []
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    by_model: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))

    for eng in scan(ctx):
        if not eng.seed_known:
            ev.append(Evidence(f"process {eng.pid}", f"{ENV}=? ({eng.env_error})", "process"))
            continue
        raw = (eng.chunk_tokens or "auto").strip().lower()
        ev.append(
            Evidence(
                f"process {eng.pid}",
                f"{ENV}={raw}" + (f", model {eng.model}" if eng.model else ""),
                "process",
            )
        )
        if raw != "auto":
            if not raw.isdigit() or int(raw) <= 0:
                findings.append(
                    (
                        Status.FAIL,
                        f"{eng.label}: {ENV}={eng.chunk_tokens!r} is neither auto nor a positive number",
                    )
                )
                fixes.append(f"unset {ENV} (auto) or give a positive token count")
                continue
            _judge_fixed(int(raw), eng.label, findings, fixes)
        by_model[eng.model or "?"][raw].append(eng.label)

    view = daemon(ctx)
    clients = engine_clients(view.stats) if view.stats else []
    declared: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for c in clients:
        ct = c.get("chunk_tokens")
        ev.append(
            Evidence(
                f"daemon {view.socket}",
                f"{client_label(c)} model {c.get('model') or '?'} chunk_tokens {ct}",
                "daemon",
            )
        )
        if ct:
            declared[c.get("model") or "?"][str(ct)].append(client_label(c))

    for source, table in (("engines", by_model), ("daemon clients", declared)):
        for model, groups in sorted(table.items()):
            if len(groups) > 1:
                parts = "; ".join(f"{v}: {', '.join(who)}" for v, who in sorted(groups.items()))
                findings.append(
                    (Status.FAIL, f"{source} of model {model} use different chunk sizes ({parts})")
                )
                fixes.append(
                    f"give every engine of a model the same {ENV} (best: unset, i.e. auto) and restart them"
                )

    if not by_model and not declared:
        own = ctx.environ.get(ENV)
        if own:
            ev.append(Evidence(f"env {ENV}", own, "env"))
            raw = own.strip().lower()
            if raw.isdigit():
                _judge_fixed(int(raw), "this shell", findings, fixes)
        if not findings:
            return skip("no running engine or daemon client to compare", ev)
    status = worst((s for s, _ in findings), Status.OK)
    if status is Status.OK:
        values = sorted({v for t in (by_model, declared) for vals in t.values() for v in vals}) or ["auto"]
        return CheckResult(Status.OK, f"chunk size {', '.join(values)} is consistent", ev)
    problems = [t for s, t in findings if s is not Status.OK]
    return CheckResult(status, "; ".join(problems), ev, fix="; ".join(dict.fromkeys(fixes)) or None)


def _judge_fixed(n: int, who: str, findings: list[tuple[Status, str]], fixes: list[str]) -> None:
    if n < SMALL:
        findings.append(
            (
                Status.WARN,
                f"{who}: {ENV}={n} is small: each chunk is overhead-bound and reloads can lose to recompute",
            )
        )
        fixes.append(f"unset {ENV} (auto sizes chunks to 128 MiB or more)")
