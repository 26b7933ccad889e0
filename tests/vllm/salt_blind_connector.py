"""A deliberately broken InferaKvdConnector, for the isolation probe's test: its keys drop ``cache_salt``.

The scheduler half normally takes vLLM's own block hashes, which carry the salt. This one recomputes
them from the prompt's tokens alone (``compat.block_hashes_for``), the mistake peers' connectors
made, so tenant B's lookup finds the chunks tenant A stored. Never use it outside that test.
"""

from __future__ import annotations

from typing import Any

from infera.engine.vllm import compat
from infera.engine.vllm.keys import chunk_hashes
from infera.engine.vllm.kvd_connector import InferaKvdConnector


class SaltBlindConnector(InferaKvdConnector):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        half = self._scheduler
        if half is None:
            return
        track = half._track

        def salt_blind(request: Any) -> Any:
            st = track(request)
            ids = list(request.prompt_token_ids or ())
            hashes = compat.block_hashes_for(vllm_config, ids)  # the tokens only: no cache_salt
            st.hashes = chunk_hashes(hashes, half.chunk_tokens, half.hash_block_size, len(ids))
            return st

        half._track = salt_blind
