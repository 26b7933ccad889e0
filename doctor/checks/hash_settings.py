"""Hash settings: every engine must derive the same block hashes, or kvd keys never meet.

Two sources: the running engine processes (their PYTHONHASHSEED, hash algorithm and vLLM version)
and what connected engines declared to the daemon (hash fingerprint per model). The rule changed
in vLLM 0.29: an unset seed is random per process before, a fixed value from then on (sha256).
The seed rule and the fingerprint grouping are :mod:`infera.keyrules`, shared with the connector, the
daemon's STATS warning and ``kvd lint`` (KVD301).
"""

from __future__ import annotations

from collections import defaultdict

from infera.doctor.checks import process_evidence
from infera.doctor.context import Context
from infera.doctor.facts.daemon import (
    ClientEngine,
    client_engines,
    client_label,
    client_name,
    daemon,
    engine_clients,
)
from infera.doctor.facts.engines import describe_settings, effective_seed, local_vllm_version, scan
from infera.doctor.facts.versions import parse_version
from infera.doctor.model import CheckResult, Evidence, Status, skip, worst
from infera.doctor.registry import check
from infera.keyrules import fingerprint_conflicts, random_seed_reason

RULE = (
    "set the same PYTHONHASHSEED on every engine (prefill and decode legs included), or leave it unset on "
    "all of them with vLLM >= 0.29 and the sha256 hash algorithm; keep the vLLM version range and block "
    "size the same"
)


@check("hash-settings", "Hash settings agree across engines", "engines", order=10)
def hash_settings(ctx: Context) -> CheckResult:
    local = local_vllm_version()
    ev: list[Evidence] = []
    ev.append(
        Evidence(
            "importlib.metadata", f"{local[0]} {local[1]}" if local else "vLLM not installed here", "note"
        )
    )
    local_ver = parse_version(local[1]) if local else None
    findings: list[tuple[Status, str]] = []
    culprits: list[int] = []

    engines = scan(ctx)
    seeds: dict[str, list[str]] = defaultdict(list)
    for eng in engines:
        ver = f"{eng.vllm[0]} {eng.vllm[1]}" if eng.vllm else (f"{local[1]} (assumed)" if local else "vLLM ?")
        ev.append(
            process_evidence(
                eng.pid,
                f"{eng.kind} engine, PYTHONHASHSEED={eng.seed_text}, hash algo {eng.hash_algo}, {ver}",
                f"model {eng.model}" if eng.model else "",
                f"children {eng.children}" if eng.children else "",
            )
        )
        if not eng.seed_known:
            findings.append((Status.UNKNOWN, f"{eng.label}: {eng.env_error}"))
            continue
        cls, problem = effective_seed(eng, local_ver)
        if problem:
            findings.append((Status.FAIL, f"{eng.label}: {problem}"))
            culprits.append(eng.pid)
        seeds[cls or "unset"].append(eng.label)
    if len(seeds) > 1:
        parts = "; ".join(f"{cls}: {', '.join(who)}" for cls, who in sorted(seeds.items()))
        findings.append((Status.FAIL, f"engines start their hash chains differently ({parts})"))

    view = daemon(ctx)
    clients = engine_clients(view.stats) if view.stats else []
    for c in clients:
        fp = c.get("hash_fingerprint") or ""
        ev.append(
            Evidence(
                f"daemon {view.socket}",
                f"{client_label(c)} model {c.get('model') or '?'} namespace {c.get('namespace') or '(default)'} "
                f"fingerprint {fp or '(none)'} settings {describe_settings(c.get('hash_settings') or {})}",
                "daemon",
            )
        )
    # An engine the process scan judged is not judged again from what it declared; any other
    # (an LLM(...) script, an engine whose environment was not readable) is, by its declaration.
    judged = {pid for eng in engines if eng.seed_known for pid in (eng.pid, *eng.children)}
    scanned = {pid for eng in engines for pid in (eng.pid, *eng.children)}
    declared = [e for e in client_engines(clients) if not e.pids & judged]
    for unit in declared:
        problem = _declared_random_seed(unit)
        if problem:
            findings.append((Status.FAIL, f"{unit.label}: {problem}"))
            culprits.append(unit.pid)
    for model, fps in fingerprint_conflicts(clients):
        parts = "; ".join(
            f"{fp}: {', '.join(dict.fromkeys(map(client_name, who)))}" for fp, who in fps.items()
        )
        findings.append(
            (Status.FAIL, f"daemon clients of model {model} declare different hash settings ({parts})")
        )
    for w in (view.stats or {}).get("warnings", []):
        ev.append(Evidence(f"daemon {view.socket}", f"warning: {w}", "daemon"))

    if not engines and not clients:
        why = "no vLLM or infera engine process is running" + (
            "" if ctx.live else " (processes are only scanned when --root is /)"
        )
        why += " and no engine is connected to a daemon" if view.reachable else ""
        return skip(why, ev, details=[f"rule: {RULE}"])
    status = worst((s for s, _ in findings), Status.OK)
    if status is Status.OK:
        what = ", ".join(sorted(seeds)) or "declared fingerprints match"
        n = len(engines) + sum(1 for e in declared if not e.pids & scanned)
        return CheckResult(Status.OK, f"{n} engine(s) agree ({what})", ev, details=[f"rule: {RULE}"])
    problems = [t for s, t in findings if s is not Status.OK]
    fix = RULE + (f"; restart pid {', '.join(map(str, culprits))} with the setting fixed" if culprits else "")
    return CheckResult(status, "; ".join(problems), ev, fix=fix if status is Status.FAIL else None)


def _declared_random_seed(unit: ClientEngine) -> str | None:
    """Why an engine connected to the daemon draws its hash seed per process, from the hash settings
    (and the vLLM version in ``kv_layout``) it declared at HELLO; None when it does not."""
    for c in unit.clients:
        settings = c.get("hash_settings") or {}
        if settings.get("seed") != "random":
            continue
        layout = c.get("kv_layout") or {}
        version = parse_version(str(layout.get("vllm") or "")) if isinstance(layout, dict) else None
        reason = random_seed_reason(str(settings.get("algo") or "?"), version)
        return f"declared a random hash seed to the daemon ({reason}), so no other engine finds its chunks"
    return None
