"""What the scheduler half sends the worker half each step (pickled across processes).

Workers never see block hashes or requests: each job is a list of chunks, each chunk its hash
(the worker adds its rank, the namespace and the group's tag to make the key), its KV cache
group and the block ids of that group it covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
except ImportError:  # the worker's copy code also runs without vLLM (kvd bench transfer)

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's base class when vLLM is not installed."""


@dataclass
class ChunkJob:
    """One chunk of one request.

    ``block_ids`` are the engine blocks the chunk covers, in order. A load writes only blocks
    ``skip`` to ``stop``: the leading ones are already in the engine from its own prefix cache
    (and may be shared with other requests), trailing ones beyond the tokens vLLM accepted are
    left to be computed. ``long``: the lookup found the chunk only in the daemon's long tier (the
    LEASE reads it first; the worker times such loads apart, for the scheduler's cost model).
    """

    chunk_hash: bytes
    block_ids: list[int]
    skip: int = 0
    stop: int | None = None
    group: int = 0
    long: bool = False


@dataclass
class RequestJob:
    """``notify``: an asynchronous load (hybrid models, vLLM 0.30+): the workers report the
    request's load as finished, or failed, to vLLM. ``fail``: the load could not be planned; it
    fails without reading anything."""

    req_id: str
    chunks: list[ChunkJob]
    retention: str = "long"
    notify: bool = False
    fail: bool = False


@dataclass
class InferaKvdMetadata(KVConnectorMetadata):
    """``step_tokens``: the tokens this step computes (the workers time steps without loads,
    for the scheduler's cost model)."""

    loads: list[RequestJob] = field(default_factory=list)
    saves: list[RequestJob] = field(default_factory=list)
    step_tokens: int = 0

    def empty(self) -> bool:
        return not (self.loads or self.saves)
