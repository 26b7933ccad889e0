"""What runs in vLLM's API server process for ``python -m infera.engine.vllm``.

``prewarm`` is the ``POST /v1/cache/prewarm`` route; ``discovery`` is the P/D flags and the etcd
registration of this worker. The entry point itself stays ``infera/engine/vllm/__main__.py``,
because ``python -m infera.engine.vllm`` is a name users type. These modules share only the top
level's ``keys``, ``config`` and ``compat`` with the engine's other processes.
"""
