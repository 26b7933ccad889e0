"""Connector settings from the environment, parsed once per process.

Every engine process (API server, EngineCore, workers) inherits the same environment, so every
half of the connector (and the prewarm route) derives the same chunk size and namespace from it.
Nothing here imports vLLM.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from infera import loadreport
from infera.engine.vllm.scheduler import loadcost
from infera.errors import UsageError
from infera.keyrules import parse_chunk_tokens  # the one reading of INFERA_KVD_CHUNK_TOKENS

log = logging.getLogger("infera.engine.vllm")

RETENTIONS = ("none", "short", "long")
RETENTION_KEY = "infera_retention"
MAX_UNKNOWN_RETENTIONS = 32  # distinct unknown values remembered for the warn-once logic
SHOWN_CHARS = 64  # how much of an unknown value a log line shows
LOAD_POLICY_ENV = "INFERA_KVD_LOAD_POLICY"
LOAD_RATES_ENV = "INFERA_KVD_LOAD_RATES"
LAYERWISE_ENV = "INFERA_KVD_LOAD_LAYERWISE"
GPU_PATH_ON_CPU_ENV = "INFERA_KVD_GPU_PATH_ON_CPU"


@dataclass(frozen=True)
class ConnectorEnv:
    """What the connector reads from the environment.

    ``chunk_tokens`` is None for ``auto``. ``ais`` is the GPU-direct request (``0``, ``1`` or
    ``auto``, see docs/gpu.md). ``gpu_staging_bytes`` bounds the GPU staging buffers of the GPU
    copy path; ``register`` False skips registering the arena mapping with the GPU (diagnostics
    and benchmarks only: copies then run at pageable-memory speed, reported as a fallback).
    ``copy_kernel`` picks how pages move between the KV blocks and GPU staging: ``auto`` (a
    Triton kernel where layers are separate tensors), ``triton`` or ``torch``.
    ``load_policy`` (``INFERA_KVD_LOAD_POLICY``): ``always`` (the default) loads every hit,
    ``auto`` only where that is faster than recomputing it, ``never`` none (saves go on);
    ``load_gbps`` / ``prefill_tps`` (``INFERA_KVD_LOAD_RATES``) replace the warm-up defaults of
    the rates it compares (:mod:`infera.engine.vllm.scheduler.loadcost`). ``load_layerwise``
    (``INFERA_KVD_LOAD_LAYERWISE=1``) copies each layer's KV in ``wait_for_layer_load`` (CPU copy
    path, :mod:`infera.engine.vllm.worker.layerwise`; GPU copy path,
    :mod:`infera.engine.vllm.worker.gpu.layerwise_gpu`). ``gpu_path_on_cpu``
    (``INFERA_KVD_GPU_PATH_ON_CPU=1``, tests and dry runs only) runs the GPU copy path's code on an
    engine whose KV is on the CPU, with synchronous stand-ins for streams.
    """

    socket: str | None = None
    chunk_tokens: int | None = None
    ais: str = "0"
    hipfile_roots: dict[str, str] = field(default_factory=dict)
    gpu_staging_bytes: int = 768 << 20
    register: bool = True
    copy_kernel: str = "auto"
    load_policy: str = loadreport.DEFAULT_POLICY
    load_gbps: dict[str, float] = field(default_factory=dict)
    prefill_tps: float | None = None
    load_layerwise: bool = False
    gpu_path_on_cpu: bool = False

    @property
    def gpu_direct_requested(self) -> bool:
        return self.ais == "1" or (self.ais == "auto" and bool(self.hipfile_roots))


def parse_ais(text: str | None) -> str:
    value = (text or "0").strip().lower()
    if value not in ("0", "1", "auto"):
        raise UsageError(f"INFERA_KVD_AIS={text!r} must be 0, 1 or auto")
    return value


def parse_roots(text: str | None) -> dict[str, str]:
    """``name=path[,name=path]`` as in the product doc (e.g. ``long=/nvme/kvd-long``)."""
    roots: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UsageError(
                f"INFERA_KVD_HIPFILE_ROOTS entry {item!r} is not name=path",
                hint="e.g. INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long",
            )
        roots[name.strip()] = path.strip()
    return roots


def parse_staging_mb(text: str | None) -> int:
    """``INFERA_KVD_GPU_STAGING_MB``: MiB of GPU staging for the GPU copy path (default 768)."""
    if text is None or not text.strip():
        return 768 << 20
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"INFERA_KVD_GPU_STAGING_MB={text!r} is not a whole number of MiB") from None
    if value < 1:
        raise UsageError(f"INFERA_KVD_GPU_STAGING_MB must be at least 1 (got {value})")
    return value << 20


def parse_copy_kernel(text: str | None) -> str:
    value = (text or "auto").strip().lower() or "auto"
    if value not in ("auto", "triton", "torch"):
        raise UsageError(f"INFERA_KVD_COPY_KERNEL={text!r} must be auto, triton or torch")
    return value


def parse_load_policy(text: str | None) -> str:
    policy = loadcost.parse_policy(text)
    if policy is None:
        raise UsageError(f"{LOAD_POLICY_ENV}={text!r} must be auto, always or never")
    return policy


def parse_load_rates(text: str | None) -> tuple[dict[str, float], float | None]:
    got = loadcost.parse_rates(text)
    if isinstance(got, str):
        raise UsageError(
            f"{LOAD_RATES_ENV}: {got}",
            hint=f"e.g. {LOAD_RATES_ENV}=ram=50,disk=3,prefill=30000 (GB/s, tokens/s)",
        )
    return got


def parse_flag(name: str, text: str | None, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{name}={text!r} must be 0 or 1")


def read_env(environ: dict[str, str] | None = None) -> ConnectorEnv:
    env = os.environ if environ is None else environ
    gbps, prefill = parse_load_rates(env.get(LOAD_RATES_ENV))
    return ConnectorEnv(
        socket=env.get("INFERA_KVD_SOCKET") or None,
        chunk_tokens=parse_chunk_tokens(env.get("INFERA_KVD_CHUNK_TOKENS")),
        ais=parse_ais(env.get("INFERA_KVD_AIS")),
        hipfile_roots=parse_roots(env.get("INFERA_KVD_HIPFILE_ROOTS")),
        gpu_staging_bytes=parse_staging_mb(env.get("INFERA_KVD_GPU_STAGING_MB")),
        register=parse_flag("INFERA_KVD_REGISTER", env.get("INFERA_KVD_REGISTER"), True),
        copy_kernel=parse_copy_kernel(env.get("INFERA_KVD_COPY_KERNEL")),
        load_policy=parse_load_policy(env.get(LOAD_POLICY_ENV)),
        load_gbps=gbps,
        prefill_tps=prefill,
        load_layerwise=parse_flag(LAYERWISE_ENV, env.get(LAYERWISE_ENV), False),
        gpu_path_on_cpu=parse_flag(GPU_PATH_ON_CPU_ENV, env.get(GPU_PATH_ON_CPU_ENV), False),
    )


def layerwise_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether ``INFERA_KVD_LOAD_LAYERWISE`` asks for layer-wise loads, for vLLM's config check
    (before the connector exists). A value the connector will refuse counts as yes: the safe
    answer keeps the CUDA graphs piecewise until the connector's own error stops the engine."""
    env = os.environ if environ is None else environ
    try:
        return parse_flag(LAYERWISE_ENV, env.get(LAYERWISE_ENV), False)
    except UsageError:
        return True


class _WarnOnce:
    """Warn once per distinct unknown retention value, in bounded memory and bounded log.

    Any HTTP client chooses ``kv_transfer_params``, so neither the remembered values nor the log
    may grow with what clients send: at most ``limit`` values are remembered (each by a short
    key, never the value itself), and once that many were seen one last line says that further
    values go unlogged; they are only counted.
    """

    def __init__(self, limit: int = MAX_UNKNOWN_RETENTIONS) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.unlogged = 0

    def warn(self, key: str, message: str, *args: object) -> None:
        if key in self.seen:
            return
        if len(self.seen) >= self.limit:
            if self.unlogged == 0:
                log.warning(
                    "kv_transfer_params.%s: %d distinct unknown values seen; not logging any more of them",
                    RETENTION_KEY,
                    self.limit,
                )
            self.unlogged += 1
            return
        self.seen.add(key)
        log.warning(message, *args)


_unknown_retentions = _WarnOnce()


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``repr`` of at most ``limit`` characters of ``text``, and its length when it was cut."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def retention_of(params: object) -> str:
    """The retention class a request asked for in ``kv_transfer_params``.

    ``ephemeral`` maps to ``long`` (the product doc: ephemeral and TTL are daemon-side only);
    anything unknown, and anything that is not a string, maps to ``long`` with one (short)
    warning per distinct value, for the first :data:`MAX_UNKNOWN_RETENTIONS` of them.
    """
    if not isinstance(params, dict):
        return "long"
    value = params.get(RETENTION_KEY)
    if value is None:
        return "long"
    if not isinstance(value, str):
        kind = type(value).__name__
        _unknown_retentions.warn(
            f"<{kind}>",
            "kv_transfer_params.%s is a %s, not one of the strings none|short|long; treating it as long",
            RETENTION_KEY,
            kind,
        )
        return "long"
    # The longest valid value is 9 characters: a longer one is unknown without copying it.
    text = value.strip().lower() if len(value) <= SHOWN_CHARS else value
    if text in RETENTIONS:
        return text
    if text == "ephemeral":
        return "long"
    key = shown(value)
    _unknown_retentions.warn(
        key,
        "kv_transfer_params.%s=%s is not one of none|short|long; treating it as long",
        RETENTION_KEY,
        key,
    )
    return "long"
