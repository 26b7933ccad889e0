"""Engine integrations: the vLLM connector and its entry point live in ``infera.engine.vllm``."""
