"""What an engine declares at HELLO about its KV layout, and what tools say about it.

The vLLM connector sends a bounded ``kv_layout`` map at HELLO: its tensor and pipeline parallel
sizes and rank, dtypes, block size, vLLM version, whether vLLM's hybrid KV cache manager is on, and
one entry per KV cache group (kind, window, layers, what each chunk stores of it, or why it is not
offloaded). The daemon only checks the bounds (:func:`check`) and shows it per client in STATS;
``kvd stat`` and ``kvd doctor`` render it per namespace (:func:`namespaces`) and say why engines
of one model do not share chunks (:func:`notes`).

Part of the contract layer: plain Python, nothing of ours but the contract.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

FIELD = "kv_layout"
MAX_KEYS = 24
MAX_KEY_CHARS = 32
MAX_TEXT = 200
MAX_GROUPS = 64
MAX_GROUP_KEYS = 16
#: facts whose difference alone keeps two engines' chunks apart (besides the namespace digest)
FACTS = ("tp", "pp", "dtype", "kv_dtype", "block_size", "mla", "vllm", "hma")
FACT_NAMES = {
    "tp": "tensor parallel size",
    "pp": "pipeline parallel size",
    "dtype": "model dtype",
    "kv_dtype": "KV cache dtype",
    "block_size": "block size",
    "mla": "MLA",
    "vllm": "vLLM version",
    "hma": "hybrid KV cache manager",
    "groups": "KV cache groups",
    "chunk_tokens": "chunk tokens",
    "hash_fingerprint": "hash settings",
}


def _scalar(where: str, value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number (not NaN or an infinity)")
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"{where} is longer than {MAX_TEXT} characters")
        return value
    raise ValueError(f"{where} must be a number, a string, a boolean or null")


def _map(where: str, value: Any, max_keys: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a map")
    if len(value) > max_keys:
        raise ValueError(f"{where} has more than {max_keys} entries")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k or len(k) > MAX_KEY_CHARS:
            raise ValueError(f"{where} keys must be strings of 1..{MAX_KEY_CHARS} characters")
        out[k] = v
    return out


def check(value: Any) -> dict[str, Any]:
    """The ``kv_layout`` of a HELLO, bounds checked (ValueError says what is wrong): a map of at
    most :data:`MAX_KEYS` scalars, and ``groups``, a list of at most :data:`MAX_GROUPS` maps of at
    most :data:`MAX_GROUP_KEYS` scalars each. A number must be finite: NaN and the infinities have
    no JSON, and what a client declares ends up in ``kvd stat --json``."""
    top = _map("'kv_layout'", value, MAX_KEYS)
    out: dict[str, Any] = {}
    for k, v in top.items():
        if k == "groups":
            if not isinstance(v, list) or len(v) > MAX_GROUPS:
                raise ValueError(f"'kv_layout.groups' must be a list of at most {MAX_GROUPS} maps")
            out[k] = [
                {
                    gk: _scalar(f"'kv_layout.groups[{i}].{gk}'", gv)
                    for gk, gv in _map(f"'kv_layout.groups[{i}]'", g, MAX_GROUP_KEYS).items()
                }
                for i, g in enumerate(v)
            ]
        else:
            out[k] = _scalar(f"'kv_layout.{k}'", v)
    return out


# -- rendering --------------------------------------------------------------------------------
def describe_group(g: Mapping[str, Any]) -> str:
    """One group as ``kvd stat`` shows it, from its HELLO entry."""
    kind = g.get("kind", "?")
    what = {
        "full": "full attention",
        "sliding": f"sliding window {g.get('window')}",
        "chunked": f"chunked local attention {g.get('attention_chunk')}",
        "state": "recurrent state",
    }.get(str(kind), str(g.get("spec") or kind))
    n = g.get("layers")
    text = f"group {g.get('group', '?')}: {what}, {n} layer{'s' if n != 1 else ''}"
    if not g.get("offload", True):
        return f"{text}; not offloaded: {g.get('reason') or 'unsupported'}"
    stored, per = g.get("stored_blocks"), g.get("blocks_per_chunk")
    if isinstance(stored, int) and isinstance(per, int):
        if stored == per:
            text += f"; offloaded: all {per} blocks of each chunk"
        else:
            text += f"; offloaded: the last {stored} of {per} blocks of each chunk (the window)"
        if kind == "chunked":
            text += ", none for chunks ending on an attention-chunk boundary"
    else:
        text += "; offloaded"
    return text


def _groups(layout: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The group maps of a layout (an odd server's entries of another type are left out)."""
    groups = layout.get("groups")
    return [g for g in groups if isinstance(g, Mapping)] if isinstance(groups, list) else []


def _groups_signature(layout: Mapping[str, Any]) -> str:
    groups = _groups(layout)
    if not groups:
        return "?"
    kinds = [str(g.get("kind", "?")) for g in groups]
    if len(set(kinds)) == 1:
        return f"{len(groups)} {kinds[0]}"
    return f"{len(groups)} ({', '.join(f'{kinds.count(k)} {k}' for k in sorted(set(kinds)))})"


def namespaces(clients: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per namespace that some client declared a ``kv_layout`` for: its model, facts, groups and
    clients, in namespace order."""
    out: dict[str, dict[str, Any]] = {}
    for c in clients:
        if not isinstance(c, Mapping):
            continue
        layout = c.get(FIELD)
        if not isinstance(layout, Mapping):
            continue
        ns = str(c.get("namespace") or "")
        entry = out.setdefault(
            ns,
            {
                "namespace": ns,
                "model": c.get("model") or "?",
                "layout": dict(layout),
                "clients": 0,
                "chunk_tokens": c.get("chunk_tokens"),
                "hash_fingerprint": c.get("hash_fingerprint"),
            },
        )
        entry["clients"] += 1
        # the scheduler sees every group's layers; a pipeline stage only its own
        if str(c.get("role", "")).endswith("scheduler"):
            entry["layout"] = dict(layout)
    return [out[k] for k in sorted(out)]


def render(clients: Iterable[Mapping[str, Any]]) -> list[str]:
    """``kvd stat`` lines: each namespace's layout and groups, then the notes."""
    clients = list(clients)
    lines: list[str] = []
    for entry in namespaces(clients):
        lay = entry["layout"]
        facts = ", ".join(
            f"{k} {lay[k]}" for k in ("tp", "pp", "dtype", "kv_dtype", "block_size", "vllm") if k in lay
        )
        hma = lay.get("hma")
        lines.append(
            f"namespace {entry['namespace'] or '(default)'}: model {entry['model']}, {facts}"
            + (f", hybrid manager {'on' if hma else 'off'}" if hma is not None else "")
            + f", {entry['clients']} client(s)"
        )
        for g in _groups(lay):
            lines.append(f"  {describe_group(g)}")
        if lay.get("load_failures"):
            lines.append(f"  load failures reach vLLM as: {lay['load_failures']}")
    lines += [f"note: {n}" for n in notes(clients)]
    return lines


def notes(clients: Iterable[Mapping[str, Any]]) -> list[str]:
    """Why engines of one model never read each other's chunks: their namespaces differ (and in
    which declared facts), or in one namespace they declare different KV cache groups."""
    entries = namespaces(clients)
    out: list[str] = []
    by_model: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_model.setdefault(str(e["model"]), []).append(e)
    for model, group in sorted(by_model.items()):
        if len(group) < 2:
            continue
        diffs = []
        for fact in (*FACTS, "groups", "chunk_tokens", "hash_fingerprint"):
            values: list[Any]
            if fact == "groups":
                values = [_groups_signature(e["layout"]) for e in group]
            elif fact in ("chunk_tokens", "hash_fingerprint"):
                values = [e.get(fact) for e in group]
            else:
                values = [e["layout"].get(fact) for e in group]
            if len({repr(v) for v in values}) > 1:
                diffs.append(f"{FACT_NAMES[fact]} " + " vs ".join(str(v) for v in values))
        why = "; ".join(diffs) if diffs else "facts they do not declare (weights, vLLM build, ...)"
        out.append(
            f"engines of model {model} use {len(group)} namespaces, so none reads another's chunks: {why}"
        )
    seen: dict[str, set[str]] = {}
    for c in clients:
        if not isinstance(c, Mapping):
            continue
        layout = c.get(FIELD)
        if isinstance(layout, Mapping) and str(c.get("role", "")).endswith("scheduler"):
            seen.setdefault(str(c.get("namespace") or ""), set()).add(_groups_signature(layout))
    for ns, sigs in sorted(seen.items()):
        if len(sigs) > 1:
            out.append(
                f"namespace {ns}: engines declare different KV cache groups ({' vs '.join(sorted(sigs))}); "
                "chunks of one are never found by the other (is the hybrid KV cache manager off on one?)"
            )
    return out


__all__ = ["FIELD", "check", "describe_group", "namespaces", "notes", "render"]
