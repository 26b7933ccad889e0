"""KV cache events for kvd's chunks: what a KV-aware router needs to know kvd holds.

vLLM polls the scheduler-side connector's ``take_events()`` every step and publishes what it
returns beside its own GPU prefix-cache events (only when ``--kv-events-config`` enables them;
otherwise :class:`KvdEvents` is off and costs nothing). kvd's events use vLLM's block hashes and
block size, so a router matches them against the same prompts:

* ``BlockStored`` (medium ``CPU``) for every block of a chunk this engine asked kvd to save;
* when a later LOOKUP finds such a chunk only on the long tier (RAM evicted it, or the daemon
  restarted): ``BlockRemoved`` (``CPU``) then ``BlockStored`` with the storage medium
  (``STORAGE`` on vLLM 0.32+, ``FS`` before);
* when a LOOKUP no longer finds it at all: ``BlockRemoved`` with the medium it was announced with.

kvd evicts inside the daemon, which tells no engine, so removals are seen (and announced) at the
next lookup of that prompt, not at the eviction. Only chunks this engine saved are announced, at
most :data:`MAX_TRACKED` of them (the oldest are forgotten, without an event).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

log = logging.getLogger("infera.engine.vllm")

MAX_TRACKED = 20_000

try:
    from vllm.distributed import kv_events as _ev

    MEDIUM_RAM: str = _ev.MEDIUM_CPU
    MEDIUM_LONG: str = str(getattr(_ev, "MEDIUM_STORAGE", None) or getattr(_ev, "MEDIUM_FS", "FS"))
except ImportError:  # pragma: no cover - a vLLM without KV events
    _ev = None  # type: ignore[assignment]
    MEDIUM_RAM, MEDIUM_LONG = "CPU", "FS"

try:
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as _convert
except ImportError:  # pragma: no cover

    def _convert(h: Any) -> Any:
        return h


def enabled_in(vllm_config: Any) -> bool:
    cfg = getattr(vllm_config, "kv_events_config", None)
    return bool(cfg is not None and getattr(cfg, "enable_kv_cache_events", False) and _ev is not None)


class KvdEvents:
    """The events of one scheduler-side connector, queued until vLLM takes them."""

    def __init__(self, *, chunk_tokens: int, hash_block_size: int) -> None:
        self.chunk_tokens = chunk_tokens
        self.hash_block_size = hash_block_size
        self.queue: list[Any] = []
        self.announced: OrderedDict[bytes, tuple[str, tuple[Any, ...]]] = OrderedDict()

    def take(self) -> list[Any]:
        out, self.queue = self.queue, []
        return out

    # -- what the scheduler half tells us ---------------------------------------------------
    def saved(self, request: Any, chunk: int, chunk_hash: bytes) -> None:
        """A save of chunk ``chunk`` of ``request`` was planned (shipped to the workers)."""
        self._store(request, chunk, chunk_hash, MEDIUM_RAM)

    def looked_up(self, request: Any, hashes: list[bytes], found: int, long_only: set[int]) -> None:
        """A LOOKUP of ``request``'s chunks found the first ``found``; those in ``long_only``
        only on the long tier."""
        for c, h in enumerate(hashes):
            known = self.announced.get(h)
            if known is None:
                continue
            medium, blocks = known
            if c >= found:
                self.queue.append(_ev.BlockRemoved(block_hashes=list(blocks), medium=medium))
                del self.announced[h]
            elif c in long_only and medium == MEDIUM_RAM:
                self.queue.append(_ev.BlockRemoved(block_hashes=list(blocks), medium=MEDIUM_RAM))
                self._store(request, c, h, MEDIUM_LONG)

    def cleared(self) -> None:
        """The connector's cache was reset: everything announced is gone."""
        for medium, blocks in self.announced.values():
            self.queue.append(_ev.BlockRemoved(block_hashes=list(blocks), medium=medium))
        self.announced.clear()

    # -- internals ---------------------------------------------------------------------------
    def _store(self, request: Any, chunk: int, chunk_hash: bytes, medium: str) -> None:
        hb = self.hash_block_size
        first = chunk * self.chunk_tokens // hb
        last = (chunk + 1) * self.chunk_tokens // hb
        all_hashes = list(getattr(request, "block_hashes", ()) or ())
        if last > len(all_hashes):
            return
        blocks = tuple(_convert(h) for h in all_hashes[first:last])
        parent = _convert(all_hashes[first - 1]) if first > 0 else None
        tokens = getattr(request, "all_token_ids", None) or getattr(request, "prompt_token_ids", None) or []
        lora = getattr(request, "lora_request", None)
        self.queue.append(
            _ev.BlockStored(
                block_hashes=list(blocks),
                parent_block_hash=parent,
                token_ids=list(tokens[first * hb : last * hb]),
                block_size=hb,
                lora_id=lora.adapter_id if lora else None,
                medium=medium,
                lora_name=lora.name if lora else None,
            )
        )
        self.announced[chunk_hash] = (medium, blocks)
        self.announced.move_to_end(chunk_hash)
        while len(self.announced) > MAX_TRACKED:
            self.announced.popitem(last=False)


__all__ = ["MEDIUM_LONG", "MEDIUM_RAM", "KvdEvents", "enabled_in"]
