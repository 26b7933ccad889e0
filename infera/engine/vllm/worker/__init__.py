"""What runs in vLLM's worker processes (one per TP/PP rank): the connector's worker half.

``half.WorkerHalf`` (with its GPU pieces in ``half_gpu.GpuWorkerMixin`` and
``half_gpu_save.GpuSaveMixin``) copies between the engine's KV blocks and the daemon's arena;
``layout`` describes the KV tensors as byte pages. The GPU copy path and GPU-direct file I/O are
the :mod:`~infera.engine.vllm.worker.gpu` sub-package. What the worker half shares with the
scheduler half (``keys``, ``config``, ``compat``, ``formats``, ``link``, ``metadata``) stays at
``infera.engine.vllm``'s top level.
"""
