"""KV cache groups: per namespace, what each group of a hybrid model stores, and why engines of one
model do not share chunks.

Reads the ``kv_layout`` each connected engine declared at HELLO (:mod:`infera.kvlayout`): parallel
sizes, dtypes, whether vLLM's hybrid KV cache manager is on, and one entry per KV cache group with
what each chunk stores of it. It warns when a group is not offloaded (a recurrent-state group: the
model's prefixes are never hits), when engines of one model use different namespaces (different
tensor or pipeline parallel sizes, dtypes, vLLM versions...), and when engines of one namespace
declare different groups (the hybrid KV cache manager off on one of them).
"""

from __future__ import annotations

from infera import kvlayout
from infera.doctor.context import Context
from infera.doctor.facts.daemon import client_label, daemon, engine_clients
from infera.doctor.model import CheckResult, Evidence, Status, skip
from infera.doctor.registry import check


@check("kv-groups", "KV cache groups and what is offloaded of each", "engines", order=25)
def kv_groups(ctx: Context) -> CheckResult:
    view = daemon(ctx)
    clients = [c for c in (engine_clients(view.stats) if view.stats else []) if c.get(kvlayout.FIELD)]
    if not clients:
        if view.stats is None:
            return skip(f"the daemon is not reachable ({view.error or 'no socket'})")
        return skip("no engine connected to the daemon declared its KV layout")
    ev = [
        Evidence(
            f"daemon {view.socket}",
            f"{client_label(c)} namespace {c.get('namespace') or '(default)'}",
            "daemon",
        )
        for c in clients
    ]
    details = kvlayout.render(clients)
    problems: list[str] = []
    for entry in kvlayout.namespaces(clients):
        for g in entry["layout"].get("groups") or []:
            if not g.get("offload", True):
                problems.append(
                    f"namespace {entry['namespace']}: {kvlayout.describe_group(g)} (no prefix of this model is a hit)"
                )
    notes = kvlayout.notes(clients)
    problems += notes
    n = len(kvlayout.namespaces(clients))
    if not problems:
        return CheckResult(
            Status.OK, f"{n} namespace(s); every KV cache group is offloaded", ev, details=details
        )
    fix = (
        "start engines that should share chunks with the same tensor/pipeline parallel sizes, dtypes, "
        "vLLM version and hybrid KV cache manager setting"
        if notes
        else "models with recurrent-state layers (Mamba, GDN) run by recompute with infera-kvd; nothing to fix"
    )
    return CheckResult(Status.WARN, "; ".join(problems), ev, fix=fix, details=details)
