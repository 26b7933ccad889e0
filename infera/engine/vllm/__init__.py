"""infera-kvd for vLLM: the ``InferaKvdConnector`` (``kvd_connector``) and ``python -m infera.engine.vllm``.

Laid out by the vLLM process the code runs in:

* this top level: the two names users type (``__main__`` and ``kvd_connector``) and what more
  than one process imports (``keys``, ``config``, ``compat``, ``formats``, ``link``, ``metadata``);
* :mod:`~infera.engine.vllm.api`: the API server (the prewarm route, P/D discovery);
* :mod:`~infera.engine.vllm.scheduler`: EngineCore, the connector's scheduler half;
* :mod:`~infera.engine.vllm.worker`: the workers, the connector's worker half, and in
  :mod:`~infera.engine.vllm.worker.gpu` the GPU copy path and GPU-direct file I/O.

Importing this package does not import vLLM; the connector module does.
"""
