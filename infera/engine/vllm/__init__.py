"""infera-kvd for vLLM: the ``InferaKvdConnector`` (``kvd_connector``) and ``python -m infera.engine.vllm``.

Importing this package does not import vLLM; the connector module does.
"""
