"""What the scheduler half keeps per request between vLLM's hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReqState:
    """One tracked request: its prompt's chunk keys and how far lookups, loads and saves got."""

    hashes: list[bytes]
    retention: str
    found: int = 0
    local_tokens: int = 0
    block_ids: list[list[int]] = field(default_factory=list)  # per KV cache group
    next_save: int = 0
    long_chunks: set[int] = field(default_factory=set)  # found chunks only the long tier holds
    hits: dict[str, int] = field(default_factory=dict)  # tier -> tokens this request loads
    request: Any = None  # kept only while KV events are on (they need its block hashes)
