"""What runs in vLLM's EngineCore process: the connector's scheduler half (``half.SchedulerHalf``).

The facade that vLLM loads, ``infera.engine.vllm.kvd_connector``, stays at the top level: it is
the ``kv_connector_module_path`` users type, and it builds either half. So do the modules the
scheduler half shares with the workers: ``keys``, ``config``, ``compat``, ``link`` and
``metadata`` (the per-step metadata is built here and read by every worker).
"""
