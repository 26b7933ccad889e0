"""INFERA_KVD_CHUNK_TOKENS: leave it at auto; never let engines of one model disagree.

A chunk's key covers its tokens, so engines (or runs) with different chunk sizes never hit each
other's chunks. With GPU-direct reads on, small fixed values make every chunk overhead-bound: auto
sizes those chunks to at least 128 MiB, where GPU-direct's fan-out pays off. What counts as invalid
or small is :func:`infera.keyrules.chunk_setting`, the same verdict ``kvd lint`` gives (KVD303, KVD408).
"""

from __future__ import annotations

from collections import defaultdict

from infera.doctor.checks import process_evidence
from infera.doctor.context import Context
from infera.doctor.facts.daemon import client_label, daemon, engine_clients
from infera.doctor.facts.engines import scan
from infera.doctor.model import CheckResult, Evidence, Status, skip, worst
from infera.doctor.registry import check
from infera.keyrules import AIS_ENV, CHUNK_TOKENS_ENV, ROOTS_ENV, ChunkSetting, chunk_setting

ENV = CHUNK_TOKENS_ENV


@check("chunk-tokens", "INFERA_KVD_CHUNK_TOKENS", "engines", order=20)
def chunk_tokens(ctx: Context) -> CheckResult:
    ev: list[Evidence] = []
    findings: list[tuple[Status, str]] = []
    fixes: list[str] = []
    by_model: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))

    for eng in scan(ctx):
        if not eng.seed_known:
            ev.append(process_evidence(eng.pid, f"{ENV}=? ({eng.env_error})"))
            continue
        raw = (eng.chunk_tokens or "auto").strip().lower()
        ev.append(
            process_evidence(
                eng.pid,
                f"{ENV}={raw}",
                f"{AIS_ENV}={eng.ais}" if eng.ais else "",
                f"model {eng.model}" if eng.model else "",
            )
        )
        setting = _judge(eng.chunk_tokens, eng.ais, eng.hipfile_roots, eng.label, findings, fixes)
        if setting.error is None:
            by_model[eng.model or "?"]["auto" if setting.tokens is None else str(setting.tokens)].append(
                eng.label
            )

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
            _judge(own, ctx.environ.get(AIS_ENV), ctx.environ.get(ROOTS_ENV), "this shell", findings, fixes)
        if not findings:
            return skip("no running engine or daemon client to compare", ev)
    status = worst((s for s, _ in findings), Status.OK)
    if status is Status.OK:
        values = sorted({v for t in (by_model, declared) for vals in t.values() for v in vals}) or ["auto"]
        return CheckResult(Status.OK, f"chunk size {', '.join(values)} is consistent", ev)
    problems = [t for s, t in findings if s is not Status.OK]
    return CheckResult(status, "; ".join(problems), ev, fix="; ".join(dict.fromkeys(fixes)) or None)


def _judge(
    text: str | None,
    ais: str | None,
    roots: str | None,
    who: str,
    findings: list[tuple[Status, str]],
    fixes: list[str],
) -> ChunkSetting:
    """Add what :func:`infera.keyrules.chunk_setting` says of one process's settings."""
    setting = chunk_setting(text, ais, roots)
    if setting.error is not None:
        findings.append((Status.FAIL, f"{who}: {ENV}={text!r} is neither auto nor a positive number"))
        fixes.append(f"unset {ENV} (auto) or give a positive token count")
    elif setting.small is not None:
        findings.append((Status.WARN, f"{who}: {ENV}={setting.tokens} is small: {setting.small}"))
        fixes.append(f"unset {ENV} (auto sizes GPU-direct chunks to 128 MiB or more)")
    return setting
