"""Prefill/decode workers registered in etcd (``kvd doctor --etcd HOST:PORT``).

Lists what ``python -m infera.engine.vllm --etcd-endpoint ...`` registered and flags the P/D traps
a router cannot report: a prefill-looking worker whose top-level ``kv_role`` made it mixed (it is
never paired), workers of one model that hash blocks differently, a decode worker carrying a kvd
connector, and a model with prefill but no decode workers (or the reverse).
"""

from __future__ import annotations

from collections import defaultdict

from infera.discovery.record import DEFAULT_PREFIX, ROLES, Worker, normalize_prefix, parse_worker
from infera.doctor.context import Context
from infera.doctor.model import CheckResult, Evidence, Status, fail, skip, warn, worst
from infera.doctor.registry import check

HASH_KEYS = ("algo", "seed", "block_size")


def describe(w: Worker) -> str:
    conns = ", ".join(f"{c.get('name')} {c.get('kv_role') or '(no role)'}" for c in w.connectors) or "none"
    h = w.hash
    seed = h.get("python_hash_seed")
    hash_text = (
        f"{h.get('algo', '?')}, PYTHONHASHSEED={'unset' if seed is None else seed} ({h.get('seed', '?')}), "
        f"block {h.get('block_size') or '?'}, vLLM {h.get('vllm_version', '?')}"
    )
    return (
        f"{w.role} {w.model} at {w.record.get('url') or w.id}: top-level kv_role "
        f"{w.record.get('kv_role') or '(absent)'} over [{conns}], kvd {'yes' if w.kvd else 'no'}; "
        f"hashes {hash_text}; transports {w.record.get('request_transport') or '?'}/"
        f"{w.record.get('kv_event_transport') or '?'}"
    )


def _minor(version: object) -> str:
    return ".".join(str(version or "?").split(".")[:2])


def intended_role(w: Worker) -> str:
    """The role a worker was meant to have: a mixed worker with a producer (consumer) child is a
    prefill (decode) leg with the wrong top-level role."""
    if w.role == "mixed":
        child_roles = {c.get("kv_role") for c in w.connectors}
        if "kv_producer" in child_roles:
            return "prefill"
        if "kv_consumer" in child_roles:
            return "decode"
    return w.role


def findings(workers: list[Worker]) -> list[tuple[Status, str, str]]:
    """(status, problem, fix) for every trap among ``workers``."""
    out: list[tuple[Status, str, str]] = []
    for w in workers:
        child_roles = {c.get("kv_role") for c in w.connectors}
        top = w.record.get("kv_role")
        if w.role == "mixed" and "kv_producer" in child_roles:
            out.append(
                (
                    Status.FAIL,
                    f"{w.id} looks like a prefill leg (a kv_producer connector) but registered as mixed "
                    f"(top-level kv_role {top or 'absent'}): the router never pairs it with a decode leg",
                    f'set "kv_role":"kv_producer" on the top level of {w.id}\'s --kv-transfer-config '
                    "(the kvd child stays kv_both) and restart it",
                )
            )
        elif w.role == "mixed" and "kv_consumer" in child_roles:
            out.append(
                (
                    Status.FAIL,
                    f"{w.id} looks like a decode leg (a kv_consumer connector) but registered as mixed "
                    f"(top-level kv_role {top or 'absent'})",
                    f'set "kv_role":"kv_consumer" on the top level of {w.id}\'s --kv-transfer-config',
                )
            )
        if w.role == "decode" and w.kvd:
            out.append(
                (
                    Status.FAIL,
                    f"decode worker {w.id} carries a kvd connector: kvd is a tier of the prefill side",
                    f"give {w.id} the bare transport connector (e.g. MooncakeConnector kv_consumer) and no "
                    "INFERA_KVD_* settings, as before kvd (kvd lint rule KVD204)",
                )
            )
        if w.hash.get("seed") == "random":
            out.append(
                (
                    Status.FAIL,
                    f"{w.id} seeds its block hashes randomly per process (vLLM {w.hash.get('vllm_version')}, "
                    "PYTHONHASHSEED unset): its keys never match another engine's or its own after a restart",
                    "set the same PYTHONHASHSEED on every engine of the model (see docs/doctor/hash-settings.md)",
                )
            )
    by_model: dict[str, list[Worker]] = defaultdict(list)
    for w in workers:
        by_model[w.model].append(w)
    for model, group in sorted(by_model.items()):
        settings: dict[tuple[str, ...], list[str]] = defaultdict(list)
        versions: dict[str, list[str]] = defaultdict(list)
        for w in group:
            if w.hash.get("seed") == "random":
                continue  # reported above
            key = tuple(str(w.hash.get(k)) for k in HASH_KEYS if w.hash.get(k) is not None)
            settings[key].append(w.id)
            versions[_minor(w.hash.get("vllm_version"))].append(w.id)
        full = {k: v for k, v in settings.items() if len(k) == len(HASH_KEYS)}
        if len(full) > 1:
            parts = "; ".join(f"{'/'.join(k)}: {', '.join(ids)}" for k, ids in sorted(full.items()))
            out.append(
                (
                    Status.FAIL,
                    f"workers of {model} hash blocks differently (algo/seed/block size: {parts})",
                    "use the same PYTHONHASHSEED (or none on every engine with vLLM >= 0.29 and sha256), "
                    "hash algorithm and block size on every leg, then restart the odd ones out",
                )
            )
        if len(versions) > 1:
            parts = "; ".join(f"{v}: {', '.join(ids)}" for v, ids in sorted(versions.items()))
            out.append(
                (
                    Status.WARN,
                    f"workers of {model} run different vLLM versions ({parts}): plain-text hashes agree, "
                    "but LoRA, multimodal and salted prompts hash differently across versions",
                    "run one vLLM version on every leg of a model",
                )
            )
        roles = {intended_role(w) for w in group}  # a mis-set top-level role is reported above
        if "prefill" in roles and "decode" not in roles:
            out.append(
                (
                    Status.WARN,
                    f"{model} has prefill workers but no decode worker registered",
                    "start the decode leg with the same --etcd-endpoint (and --discovery-prefix)",
                )
            )
        if "decode" in roles and "prefill" not in roles:
            out.append(
                (
                    Status.WARN,
                    f"{model} has decode workers but no prefill worker registered",
                    "start the prefill leg with the same --etcd-endpoint (and --discovery-prefix)",
                )
            )
        pd = [w for w in group if w.role in ("prefill", "decode")]
        transports = {(w.record.get("request_transport"), w.record.get("kv_event_transport")) for w in pd}
        if len(transports) > 1:
            parts = ", ".join(
                f"{w.id} {w.record.get('request_transport')}/{w.record.get('kv_event_transport')}" for w in pd
            )
            out.append(
                (
                    Status.WARN,
                    f"P/D workers of {model} disagree on request/KV-event transports ({parts})",
                    "pass the same --request-transport and --kv-event-transport to both legs",
                )
            )
    return out


def _summary(workers: list[Worker], endpoint: str) -> str:
    counts = {r: sum(1 for w in workers if w.role == r) for r in ("prefill", "decode", "mixed")}
    models = sorted({w.model for w in workers})
    shown = ", ".join(f"{n} {r}" for r, n in counts.items() if n)
    text = f"{len(workers)} worker{'s' if len(workers) != 1 else ''} in etcd at {endpoint} ({shown}"
    text += f"; model {models[0]})" if len(models) == 1 else f"; {len(models)} models)"
    if len(workers) <= 4:
        text += ": " + ", ".join(f"{w.role} {w.id}" for w in workers)
    return text


@check("pd-workers", "P/D workers registered in etcd", "pd", order=10)
def pd_workers(ctx: Context) -> CheckResult:
    from infera.discovery.etcd import EtcdClient
    from infera.errors import KvdError

    endpoint = ctx.options.etcd
    prefix = normalize_prefix(ctx.options.etcd_prefix or DEFAULT_PREFIX)
    if not endpoint:
        return skip("no --etcd given (pass --etcd HOST:PORT to list the prefill/decode workers)")
    try:
        with EtcdClient(endpoint, timeout=3.0) as client:
            kvs = client.get_prefix(prefix)
            where = client.endpoint.split("://", 1)[-1]
    except KvdError as exc:
        return fail(
            f"cannot read etcd at {endpoint}: {exc.message}",
            [Evidence(endpoint, exc.message, "etcd")],
            fix=exc.hint or "check --etcd (the client URL of etcd, HOST:PORT)",
        )
    workers: list[Worker] = []
    ev: list[Evidence] = []
    bad: list[str] = []
    for kv in kvs:
        try:
            w = parse_worker(kv.key, kv.value, kv.lease)
        except ValueError as exc:
            bad.append(f"{kv.key}: {exc}")
            ev.append(Evidence(f"etcd {kv.key}", f"unreadable: {exc}", "etcd"))
            continue
        workers.append(w)
        ev.append(Evidence(f"etcd {kv.key}", describe(w), "etcd"))
    if not workers:
        return warn(
            f"no worker registered under {prefix} in etcd at {where}"
            + (f" ({len(bad)} unreadable keys)" if bad else ""),
            ev,
            fix="start the engines with `python -m infera.engine.vllm ... --etcd-endpoint "
            f"{endpoint}` (and the same --discovery-prefix), or pass --etcd-prefix",
        )
    workers.sort(key=lambda w: (ROLES.index(w.role), w.model, w.id))
    found = findings(workers)
    if bad:
        found.append((Status.WARN, f"{len(bad)} keys under {prefix} are not worker records", ""))
    details = [describe(w) for w in workers]
    status = worst((s for s, _, _ in found), Status.OK)
    summary = _summary(workers, where)
    problems = [t for s, t, _ in found if s in (Status.FAIL, Status.WARN)]
    if problems:
        summary = "; ".join(problems)
        details = [f"registered: {_summary(workers, where)}", *details]
    fixes = [f for s, _, f in found if f and s in (Status.FAIL, Status.WARN)]
    return CheckResult(status, summary, ev, fix="; ".join(dict.fromkeys(fixes)) or None, details=details)
