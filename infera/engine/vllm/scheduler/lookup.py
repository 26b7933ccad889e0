"""One LOOKUP of a prompt's chunk keys: how many leading chunks the daemon holds, and where."""

from __future__ import annotations

from typing import Any

from infera.engine.vllm import groups


def count_found(
    c: Any, keys: list[bytes], per_chunk: list[int], hold_ms: int, verify: bool, counters: dict[str, int]
) -> tuple[int, set[int], str]:
    """``(found, long_chunks, long_tier)`` through client ``c``: the leading chunks held for every
    group and rank, those of them only the long tier has, and the daemon's long tier's name.

    With ``verify`` (a load this vLLM cannot fail: several groups, before 0.30) every found chunk
    is first made sure of in RAM (a long-tier chunk is read, and checked, now) and held there for
    the load; what the daemon will not hold (its ``--client-quota``) is not offered, since it could
    be evicted before the load.
    """
    count, on_long = c.lookup_tiers(keys, hold_ms=hold_ms)
    long_tier = str(c.long_tier)
    found = groups.whole_chunks(count, per_chunk)
    long_chunks = groups.chunks_of(on_long, per_chunk, found)
    if not verify or not found:
        return found, long_chunks, long_tier
    n = sum(per_chunk[:found])
    items = c.lease(keys[:n])
    c.release([it[0] for it in items if it is not None])
    present = next((i for i, it in enumerate(items) if it is None), n)
    ok = groups.whole_chunks(present, per_chunk)
    if ok < found:
        counters["verify_lost_chunks"] += found - ok
    if ok:
        _, held = c.hold(keys[: sum(per_chunk[:ok])], hold_ms)
        kept = groups.whole_chunks(held, per_chunk)
        if kept < ok:
            counters["verify_unheld_chunks"] += ok - kept
            ok = kept
    return ok, {i for i in long_chunks if i < ok}, long_tier
