"""What the connector says once at engine start (by its scheduler instance, one per engine) about
settings that cost hits, and what its ``kv_role`` lets it do.

Pure functions over plain values (no vLLM): the facade passes the engine's facts, the parsed
environment and its kv-transfer-config.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infera.engine.vllm.config import CHUNK_TOKENS_ENV, extra_config_notice
from infera.engine.vllm.keys import EngineFacts
from infera.keyrules import SEED_ENV, chunk_never_hits, random_seed_reason
from infera.versions import parse_version

log = logging.getLogger("infera.engine.vllm")


@dataclass(frozen=True)
class RoleUse:
    """What a ``kv_role`` lets the connector do: ``kv_both`` loads hits and stores prompts,
    ``kv_producer`` only stores, ``kv_consumer`` only loads (docs/connector.md, "kv_role")."""

    role: str
    loads: bool
    saves: bool


ROLES = {
    "kv_both": RoleUse("kv_both", loads=True, saves=True),
    "kv_producer": RoleUse("kv_producer", loads=False, saves=True),
    "kv_consumer": RoleUse("kv_consumer", loads=True, saves=False),
}


def role_use(kv_role: object) -> RoleUse:
    """The connector's own ``kv_role`` (a MultiConnector child's role is its own); anything vLLM
    would not accept counts as ``kv_both``."""
    return ROLES.get(str(kv_role), ROLES["kv_both"])


def role_message(use: RoleUse) -> str | None:
    if use.role == "kv_producer":
        return (
            "infera-kvd: kv_role is kv_producer, so this engine stores its prompts' chunks but loads "
            "no hits from the daemon; give InferaKvdConnector kv_role kv_both to load them too"
        )
    if use.role == "kv_consumer":
        return (
            "infera-kvd: kv_role is kv_consumer, so this engine loads hits from the daemon but "
            "stores nothing; give InferaKvdConnector kv_role kv_both to store its prompts too"
        )
    return None


def hash_seed_message(facts: EngineFacts) -> str | None:
    """The warning for an engine whose block hashes start from a seed drawn per process."""
    if facts.hash_seed != "random":
        return None
    reason = random_seed_reason(facts.hash_algo, parse_version(facts.vllm_version))
    return (
        f"infera-kvd: {reason}, so chunks stored by this engine can never be found by another "
        f"engine or after a restart; set the same {SEED_ENV} on every engine"
    )


def chunk_message(chunk_tokens: int, max_model_len: int | None, block_size: int) -> str | None:
    """The warning for chunks no prompt of this engine can fill with a token to spare."""
    if not isinstance(max_model_len, int):
        return None
    why = chunk_never_hits(chunk_tokens, max_model_len)
    if why is None:
        return None
    return (
        f"infera-kvd: {why}; set {CHUNK_TOKENS_ENV} to fewer tokens than {max_model_len} (a "
        f"multiple of the block size {block_size}, or unset for auto) or raise --max-model-len"
    )


def log_start(
    facts: EngineFacts,
    *,
    chunk_tokens: int,
    max_model_len: int | None,
    use: RoleUse,
    extra_config: Mapping[str, Any] | None,
    failure_policy: str | None,
) -> None:
    """Each start-up warning that applies, once (the scheduler instance calls this)."""
    lines = [
        hash_seed_message(facts),
        chunk_message(chunk_tokens, max_model_len, facts.block_size),
        role_message(use),
    ]
    notice = extra_config_notice(extra_config)
    if notice:
        lines.append("infera-kvd: " + notice)
    if failure_policy == "fail":
        lines.append(
            "infera-kvd: kv_load_failure_policy is 'fail', so a chunk that disappears between "
            "lookup and load fails its request; set it to 'recompute' (python -m "
            "infera.engine.vllm does this for you)"
        )
    for line in lines:
        if line:
            log.warning(line)
