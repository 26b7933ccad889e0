"""The worker's GPU path: copies between GPU KV pages and the arena, and GPU-direct file I/O.

``copier`` (``GpuCopier``) groups and issues the copies, on ``runtime``'s streams, events,
completion thread and host registration, with ``kernel`` (and its Triton source
``kernel_triton``) for the one-launch page copy; ``gpudirect`` selects and binds cuFile or
hipFile, and ``gdpath`` is what the worker does with it (chunk-file reads into staging, writes
from a GPU pool). Only the worker processes import this; the scheduler half and the API server
never do. The package itself imports nothing (torch comes with its modules).
"""
