"""Who may connect to the daemon, and what that gives them: namespaces are not a security boundary.

Every client the daemon accepts (its own uid, plus ``--allow-uid``) is handed the arena's file
descriptor at HELLO and maps the whole arena, every namespace's chunks included. Namespaces keep
engines with different models or settings from *finding* each other's chunks; they do not keep
one local user from *reading* another's KV (prompts can be reconstructed from KV). Tenants that
must not see each other need a daemon each (each with its own ``--socket``), or ``cache_salt``
within one engine and one trust domain.
"""

from __future__ import annotations

from infera.doctor.context import Context
from infera.doctor.facts.kvdconf import settings
from infera.doctor.facts.procs import uid
from infera.doctor.model import CheckResult, Evidence, ok, warn
from infera.doctor.registry import check
from infera.kvd.flags import Uids

BOUNDARY = (
    "namespaces are not a security boundary between local users: every allowed client maps the whole "
    "arena, every namespace's KV included"
)


def allowed_uids(ctx: Context) -> tuple[str, bool, Evidence | None]:
    """(who may connect, whether that is more than one uid, the evidence)."""
    s = settings(ctx)
    spec = s.get("allow_uid")
    own = uid(ctx, s.pid) if s.pid is not None else None
    if not isinstance(spec, Uids) or not (spec.uids or spec.names or spec.anyone):
        who = f"only the daemon's own uid{f' {own}' if own is not None else ''}"
        return who, False, Evidence("--allow-uid", f"not given ({s.where('allow_uid')})", "note")
    if spec.anyone:
        return "any local uid ('*')", True, Evidence("--allow-uid", f"* ({s.where('allow_uid')})", "note")
    others = sorted(str(u) for u in spec.uids if u != own) + list(spec.names)
    text = ", ".join(others)
    ev = Evidence("--allow-uid", f"{text} ({s.where('allow_uid')})", "note")
    if not others:
        return f"only the daemon's own uid {own}", False, ev
    return f"the daemon's own uid{f' {own}' if own is not None else ''} and {text}", True, ev


@check("arena-sharing", "who may map the arena (namespaces are not a security boundary)", "daemon", order=30)
def arena_sharing(ctx: Context) -> CheckResult:
    who, many, e = allowed_uids(ctx)
    ev = [e] if e else []
    if many:
        return warn(
            f"{who} may connect: {BOUNDARY}",
            ev,
            fix="give tenants that must not read each other's KV a daemon each (own --socket, no --allow-uid); "
            "cache_salt separates tenants' keys within one trust domain, not their access to the arena",
        )
    return ok(f"{who} may connect (one uid: the arena is not shared between local users)", ev)
