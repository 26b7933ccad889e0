"""KV cache groups: what each group of a hybrid model stores per chunk, and which hits it can serve.

vLLM's hybrid KV cache manager splits a model's layers into *groups* that share one block table
each (Gemma 3: one full-attention group and five sliding-window groups of one layer each). A
request then has one list of block ids per group; for a sliding-window group the blocks that
left the window are the null block (id 0), and a hit of ``E`` tokens gets real blocks only for the
tokens it still attends to: ``[skipped(E), E)``, where ``skipped`` is the group manager's
``get_num_skipped_tokens`` (research: vLLM ``single_type_kv_cache_manager.py``).

Pure functions over plain facts, shared by the scheduler half (lookups, load and save plans),
the worker half (one layout per group) and the prewarm route; ``compat`` turns vLLM's group
specs into :class:`GroupPlan`. Nothing here imports vLLM.

**What a chunk stores per group.** Chunk ``c`` covers tokens ``[c*T, (c+1)*T)``. A hit ends on a
chunk boundary (or, when every group can serve it, on a block boundary inside the last chunk).
Every chunk boundary is a hit candidate, so chunk ``c`` stores, per group, exactly the blocks a hit
ending at its own end reads:

* full attention: all of the chunk's blocks;
* sliding window ``w``: the last ``ceil((w - 1 + extra) / block_size)`` blocks of the chunk (all of
  them when the window is longer than the chunk); earlier blocks are outside the window of every
  later hit end too;
* chunked local attention (``attention_chunk_size`` ``a``): the whole chunk unless the chunk ends on
  a multiple of ``a`` (a hit there reads nothing of this group), then nothing;
* recurrent state (Mamba, GDN) and anything else: not offloaded (see :func:`blockers`).

A hit ending at ``E`` loads, per group, the blocks of ``[max(local, skipped(E)), E)``; for a chunk
boundary ``E`` these always lie inside what the chunks store (the stored range of a chunk only
grows towards its start with the window, and ``skipped`` never decreases). A hit ending inside a
chunk is offered only when every group can serve it (:func:`servable`); otherwise it is cut back
to the last chunk boundary.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

FULL = "full"
SLIDING = "sliding"
CHUNKED = "chunked"
STATE = "state"
OTHER = "other"
KINDS = (FULL, SLIDING, CHUNKED, STATE, OTHER)
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GroupPlan:
    """One KV cache group as the connector sees it.

    ``layers`` are this process's layer names of the group (a pipeline stage may have none);
    ``num_layers`` the group's layer count in the whole model (what the scheduler knows).
    ``offload`` False with a ``reason`` for groups whose KV the connector cannot store.
    """

    index: int
    kind: str
    block_size: int
    window: int | None = None
    attention_chunk: int | None = None
    extra_tokens: int = 0
    num_layers: int = 0
    spec: str = ""
    offload: bool = True
    reason: str = ""
    transfer: bool = True
    layers: tuple[str, ...] = field(default=(), compare=False)

    # -- vLLM's arithmetic -------------------------------------------------------------------
    def skipped(self, computed: int) -> int:
        """Tokens before ``computed`` that this group no longer reads (vLLM's
        ``get_num_skipped_tokens``): the null blocks of a request that computed that many."""
        if self.kind == SLIDING and self.window:
            return max(0, computed - self.window + 1 - self.extra_tokens)
        if self.kind == CHUNKED and self.attention_chunk:
            return computed // self.attention_chunk * self.attention_chunk
        return 0

    def window_blocks(self) -> int:
        """Blocks a sliding-window group reads at a block-aligned hit end (vLLM's
        ``cdiv(sliding_window - 1, block_size)``, plus the retained extra tokens)."""
        assert self.window is not None
        return _cdiv(self.window - 1 + self.extra_tokens, self.block_size)

    # -- storage per chunk -------------------------------------------------------------------
    def blocks_per_chunk(self, chunk_tokens: int) -> int:
        return chunk_tokens // self.block_size

    def stored_blocks(self, chunk_tokens: int) -> int:
        """How many blocks a chunk that stores this group holds (the same for every chunk)."""
        bpc = self.blocks_per_chunk(chunk_tokens)
        if self.kind == SLIDING and self.window:
            return min(bpc, self.window_blocks())
        return bpc

    def stored_range(self, chunk: int, chunk_tokens: int) -> tuple[int, int] | None:
        """Blocks ``[first, stop)`` of chunk ``chunk`` (counted within the chunk) that it stores
        for this group, or None when it stores nothing of it."""
        if not self.offload:
            return None
        bpc = self.blocks_per_chunk(chunk_tokens)
        if self.kind == CHUNKED:
            end = (chunk + 1) * chunk_tokens
            return None if self.skipped(end) >= end else (0, bpc)
        return bpc - self.stored_blocks(chunk_tokens), bpc

    def needed_blocks(self, local: int, end: int) -> tuple[int, int]:
        """Block indices ``[first, stop)`` (of the request) a hit from ``local`` to ``end`` tokens
        must load for this group: vLLM holds the blocks of ``[skipped(end), end)``, the local prefix
        cache already filled those below ``local``."""
        bs = self.block_size
        first = max(local // bs, self.skipped(end) // bs)
        stop = _cdiv(end, bs)
        return first, max(first, stop)

    # -- what kvd stat and the logs show -----------------------------------------------------
    def what(self) -> str:
        return {
            FULL: "full attention",
            SLIDING: f"sliding window {self.window}",
            CHUNKED: f"chunked local attention {self.attention_chunk}",
            STATE: "recurrent state",
            OTHER: self.spec or "other",
        }[self.kind]

    def stores(self, chunk_tokens: int) -> str:
        """What each chunk holds of this group, in words."""
        if not self.offload:
            return f"not offloaded ({self.reason})"
        bpc = self.blocks_per_chunk(chunk_tokens)
        text = f"{self.stored_blocks(chunk_tokens)} of {bpc} blocks per chunk"
        if self.kind == CHUNKED:
            text += ", none for chunks ending on an attention chunk"
        return text

    def describe(self, chunk_tokens: int | None = None) -> str:
        n = self.num_layers
        text = f"group {self.index} ({self.what()}, {n} layer{'s' if n != 1 else ''})"
        if not self.offload or chunk_tokens:
            text += f": {self.stores(chunk_tokens or self.block_size)}"
        return text

    def to_wire(self) -> dict[str, Any]:
        """The group as declared at HELLO (bounded: scalars only, see :mod:`infera.kvlayout`)."""
        out: dict[str, Any] = {
            "group": self.index,
            "kind": self.kind,
            "block_size": self.block_size,
            "layers": self.num_layers,
            "offload": self.offload,
        }
        if self.window is not None:
            out["window"] = self.window
        if self.attention_chunk is not None:
            out["attention_chunk"] = self.attention_chunk
        if self.extra_tokens:
            out["extra_tokens"] = self.extra_tokens
        if self.spec:
            out["spec"] = self.spec[:80]
        if self.reason:
            out["reason"] = self.reason[:200]
        if not self.transfer:
            out["transfer"] = False
        return out

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> GroupPlan:
        return cls(
            index=int(d["group"]),
            kind=str(d["kind"]),
            block_size=int(d["block_size"]),
            window=d.get("window"),
            attention_chunk=d.get("attention_chunk"),
            extra_tokens=int(d.get("extra_tokens", 0)),
            num_layers=int(d.get("layers", 0)),
            spec=str(d.get("spec", "")),
            offload=bool(d.get("offload", True)),
            reason=str(d.get("reason", "")),
            transfer=bool(d.get("transfer", True)),
        )


@dataclass(frozen=True)
class Plan:
    """Every group of one engine, and the chunk size they are cut into."""

    groups: tuple[GroupPlan, ...]
    chunk_tokens: int

    @property
    def hybrid(self) -> bool:
        """More than one group: chunk keys carry the group (single-group keys stay as they were)."""
        return len(self.groups) > 1

    @cached_property
    def offloaded(self) -> tuple[GroupPlan, ...]:
        return tuple(g for g in self.groups if g.offload)

    # The scheduler asks these once per chunk of every request (512 chunks at 16k tokens of an
    # 8B model): a plan is frozen, so what does not depend on the chunk is worked out once.
    @property
    def varies_by_chunk(self) -> bool:
        """What a chunk stores differs from chunk to chunk (a chunked-local attention group)."""
        return self._same_every_chunk is None

    @cached_property
    def _same_every_chunk(self) -> tuple[tuple[GroupPlan, int, int], ...] | None:
        """:meth:`chunk_groups` of any chunk, when it is the same for all (no chunked-local group)."""
        if any(g.kind == CHUNKED for g in self.offloaded):
            return None
        return tuple(self._chunk_groups(0))

    @cached_property
    def _whole_chunks_only(self) -> bool:
        """Every chunk stores every block of every offloaded group: any hit is servable."""
        same = self._same_every_chunk
        return same is not None and all(
            first == 0 and stop == g.blocks_per_chunk(self.chunk_tokens) for g, first, stop in same
        )

    @property
    def group_ids(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.offloaded)

    def tag(self, group: int) -> bytes:
        """What the chunk key of ``group`` adds to the namespace, rank and chunk hash: nothing
        for a single-group engine; else the group's place and shape, the same in the scheduler
        and every worker (layer names are not in it: a pipeline stage sees only its own)."""
        if not self.hybrid:
            return b""
        g = self.groups[group]
        text = f"g{g.index}:{g.kind}:{g.block_size}:{g.window}:{g.attention_chunk}:{g.extra_tokens}:{len(self.groups)}"
        return hashlib.blake2b(text.encode(), digest_size=8).digest()

    def chunk_groups(self, chunk: int) -> Sequence[tuple[GroupPlan, int, int]]:
        """``(group, first, stop)`` for every group chunk ``chunk`` stores, in group order."""
        same = self._same_every_chunk
        return same if same is not None else self._chunk_groups(chunk)

    def _chunk_groups(self, chunk: int) -> list[tuple[GroupPlan, int, int]]:
        out = []
        for g in self.offloaded:
            rng = g.stored_range(chunk, self.chunk_tokens)
            if rng is not None:
                out.append((g, rng[0], rng[1]))
        return out

    def servable(self, local: int, end: int) -> bool:
        """True when every group's blocks of a hit from ``local`` to ``end`` lie inside what the
        chunks store (always true at a chunk boundary)."""
        if self._whole_chunks_only:
            return True
        ct = self.chunk_tokens
        for g in self.offloaded:
            first, stop = g.needed_blocks(local, end)
            bpc = g.blocks_per_chunk(ct)
            for b in range(first, stop):
                rng = g.stored_range(b // bpc, ct)
                if rng is None or not rng[0] <= b % bpc < rng[1]:
                    return False
        return True

    def hit_end(self, local: int, end: int) -> int:
        """The longest hit ``<= end`` that every group can serve (``local`` when none)."""
        ct = self.chunk_tokens
        while end > local:
            if self.servable(local, end):
                return end
            end = (end - 1) // ct * ct
        return local

    def describe(self) -> list[str]:
        return [g.describe(self.chunk_tokens) for g in self.groups]

    def summary(self) -> str:
        """The groups in one line, alike groups counted together (Gemma 3: five sliding-window
        groups and one full-attention group)."""
        seen: dict[str, list[GroupPlan]] = {}
        for g in self.groups:
            seen.setdefault(f"{g.what()}: {g.stores(self.chunk_tokens)}", []).append(g)
        parts = []
        for text, gs in seen.items():
            ids = ",".join(str(g.index) for g in gs)
            layers = sum(g.num_layers for g in gs)
            plural = "s" if layers != 1 else ""
            parts.append(f"{'group' if len(gs) == 1 else 'groups'} {ids} ({layers} layer{plural}) {text}")
        return "; ".join(parts)

    def to_wire(self) -> list[dict[str, Any]]:
        """The groups as declared at HELLO, with what each chunk stores of them."""
        out = []
        for g in self.groups:
            d = g.to_wire()
            if g.offload:
                d["blocks_per_chunk"] = g.blocks_per_chunk(self.chunk_tokens)
                d["stored_blocks"] = g.stored_blocks(self.chunk_tokens)
            out.append(d)
        return out

    @classmethod
    def from_wire(cls, groups: Iterable[dict[str, Any]], chunk_tokens: int) -> Plan:
        return cls(tuple(GroupPlan.from_wire(d) for d in groups), chunk_tokens)

    def with_layers(self, layers: dict[int, Sequence[str]]) -> Plan:
        """The same plan with this process's layer names per group."""
        return Plan(
            tuple(replace(g, layers=tuple(layers.get(g.index, ()))) for g in self.groups), self.chunk_tokens
        )


def plan_keys(
    plan: Plan, ns_digest: bytes, hashes: Sequence[bytes], ranks: int
) -> tuple[list[bytes], list[int]]:
    """Keys for one LOOKUP of every rank's share of every group of every chunk, chunk-major,
    and how many keys each chunk has (LOOKUP counts present keys up to the first miss)."""
    from infera.engine.vllm.keys import chunk_keyer

    keys: list[bytes] = []
    per_chunk: list[int] = []
    makers = {
        g.index: [chunk_keyer(ns_digest, r, plan.tag(g.index)) for r in range(ranks)] for g in plan.groups
    }
    for c, h in enumerate(hashes):
        n = 0
        for g, _first, _stop in plan.chunk_groups(c):
            for make in makers[g.index]:
                keys.append(make(h))
                n += 1
        per_chunk.append(n)
    return keys, per_chunk


def whole_chunks(count: int, per_chunk: Sequence[int]) -> int:
    """How many leading chunks have every key present, from LOOKUP's count."""
    done = 0
    for n in per_chunk:
        if count < n:
            break
        count -= n
        done += 1
    return done


def chunks_of(indices: Iterable[int], per_chunk: Sequence[int], found: int) -> set[int]:
    """The chunks (of the first ``found``) that the given key indices of a :func:`plan_keys`
    LOOKUP fall in."""
    starts: list[int] = []
    total = 0
    for n in per_chunk[:found]:
        starts.append(total)
        total += n
    return {bisect.bisect_right(starts, i) - 1 for i in indices if 0 <= i < total}


def single_group(block_size: int, chunk_tokens: int, num_layers: int = 0) -> Plan:
    """The plan of an engine with one full-attention group (or no KV cache config to read)."""
    return Plan((GroupPlan(0, FULL, block_size, num_layers=num_layers),), chunk_tokens)


def blockers(plan: Plan) -> list[GroupPlan]:
    """Groups that stop every hit: a hit must restore every group the model reads (a group vLLM
    itself rebuilds after a connector load, ``transfer`` False, is not needed)."""
    return [g for g in plan.groups if g.transfer and not g.offload]


def lcm_block_size(plan: Plan) -> int:
    """The smallest token count that is a whole number of blocks in every group."""
    import math

    out = 1
    for g in plan.groups:
        out = out * g.block_size // math.gcd(out, g.block_size)
    return out


__all__ = [
    "ATTENTION_KINDS",
    "CHUNKED",
    "FULL",
    "KINDS",
    "OTHER",
    "SLIDING",
    "STATE",
    "GroupPlan",
    "Plan",
    "blockers",
    "chunks_of",
    "lcm_block_size",
    "plan_keys",
    "single_group",
    "whole_chunks",
]
