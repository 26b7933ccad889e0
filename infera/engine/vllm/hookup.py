"""How our code sits inside a vLLM process: its log lines go through vLLM's handlers, the
connector is known to vLLM's factory by name, and a hit's tier maps to vLLM's cache-hit source.

Importing this module imports nothing of vLLM beyond what the connector's own module does.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("infera.engine.vllm")


def adopt_vllm_logging(*names: str, level: int | None = None) -> None:
    """Print the ``names`` loggers' lines through vLLM's handlers, so they look like (and sit
    with) vLLM's; ``level`` None takes vLLM's. A logger with handlers of its own is left alone."""
    theirs = logging.getLogger("vllm")
    for name in names or ("infera.engine.vllm",):
        ours = logging.getLogger(name)
        if ours.handlers or not theirs.handlers:
            continue
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(level if level is not None else (theirs.level or logging.INFO))
        ours.propagate = False


def register_by_name(module: str) -> None:
    """Under a MultiConnector the API-server process rebuilds each child's stats by class name
    (``KVConnectorFactory.get_connector_class_by_name``): make ours known by name too."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        if "InferaKvdConnector" not in KVConnectorFactory._registry:
            KVConnectorFactory.register_connector("InferaKvdConnector", module, "InferaKvdConnector")
    except Exception:  # pragma: no cover - a vLLM without a registry: stats stay per-connector
        log.debug("infera-kvd: could not register the connector by name", exc_info=True)


try:  # vLLM 0.32+: vllm:prompt_tokens_cached_by_source counts our hits by the tier that held them
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    HIT_SOURCE: Any = CacheHitSource.HOST
    # the distributed tier is another host's store reached over the network: of vLLM's sources,
    # p2p ("transferred from another vLLM instance") is the nearest
    TIER_SOURCE: dict[str, Any] = {
        "ram": CacheHitSource.HOST,
        "disk": CacheHitSource.DISK,
        "distributed": CacheHitSource.P2P,
    }
except ImportError:  # pragma: no cover - older vLLM
    HIT_SOURCE = None
    TIER_SOURCE = {}


__all__ = ["HIT_SOURCE", "TIER_SOURCE", "adopt_vllm_logging", "register_by_name"]
