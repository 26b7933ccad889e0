"""infera-kvd: keep LLM KV cache alive below the GPU."""

__version__ = "0.1.0"
