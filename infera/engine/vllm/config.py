"""Connector settings from the environment: the one reading of every ``INFERA_KVD_*`` variable.

Every engine process (API server, EngineCore, workers) inherits the same environment, so every
half of the connector (and the prewarm route) derives the same chunk size and namespace from it.
:data:`VARIABLES` lists each variable the connector reads with its parser, its default and what
it does. Everything that judges these values calls those parsers: the connector
(:func:`read_env`), the engine entry point (``python -m infera.engine.vllm`` checks them before
vLLM starts) and ``kvd lint`` (KVD408); the table of docs/engine.md is checked against
:func:`docs_table` (tests/engine/test_config_formats.py).

Part of the contract layer (docs/design.md, "Layers"): plain Python, no vLLM or torch, nothing of
ours but other contract modules, so the tools can import it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infera.errors import UsageError
from infera.keyrules import AIS_ENV, CHUNK_TOKENS_ENV, ROOTS_ENV
from infera.keyrules import parse_chunk_tokens as parse_chunk_tokens  # INFERA_KVD_CHUNK_TOKENS
from infera.kvd.clientnet import MAX_SPIN_US, SPIN_ENV, parse_spin_us  # the client's own setting
from infera.loadreport import DEFAULT_POLICY, POLICIES, TIERS

SOCKET_ENV = "INFERA_KVD_SOCKET"
STAGING_ENV = "INFERA_KVD_GPU_STAGING_MB"
REGISTER_ENV = "INFERA_KVD_REGISTER"
COPY_KERNEL_ENV = "INFERA_KVD_COPY_KERNEL"
LOAD_POLICY_ENV = "INFERA_KVD_LOAD_POLICY"
LOAD_RATES_ENV = "INFERA_KVD_LOAD_RATES"
LAYERWISE_ENV = "INFERA_KVD_LOAD_LAYERWISE"
GPU_PATH_ON_CPU_ENV = "INFERA_KVD_GPU_PATH_ON_CPU"
REPORT_EVERY_ENV = "INFERA_KVD_REPORT_EVERY_S"

DEFAULT_STAGING_MB = 768
DEFAULT_REPORT_EVERY_S = 5.0
RATE_NAMES = (*TIERS, "prefill")
RATES_HINT = f"e.g. {LOAD_RATES_ENV}=ram=50,disk=3,prefill=30000 (GB/s, tokens/s), each name once"


@dataclass(frozen=True)
class ConnectorEnv:
    """What the connector reads from the environment; :data:`VARIABLES` says what each field does.

    ``chunk_tokens`` is None for ``auto``; ``load_gbps`` / ``prefill_tps`` are
    ``INFERA_KVD_LOAD_RATES`` (the warm-up rates of :mod:`infera.engine.vllm.scheduler.loadcost`);
    ``register`` False (diagnostics only) skips registering the arena mapping with the GPU;
    ``load_layerwise`` copies each layer's KV in ``wait_for_layer_load``
    (:mod:`infera.engine.vllm.worker.layerwise`, :mod:`infera.engine.vllm.worker.gpu.layerwise_gpu`).
    """

    socket: str | None = None
    chunk_tokens: int | None = None
    ais: str = "0"
    hipfile_roots: dict[str, str] = field(default_factory=dict)
    gpu_staging_bytes: int = DEFAULT_STAGING_MB << 20
    register: bool = True
    copy_kernel: str = "auto"
    load_policy: str = DEFAULT_POLICY
    load_gbps: dict[str, float] = field(default_factory=dict)
    prefill_tps: float | None = None
    load_layerwise: bool = False
    gpu_path_on_cpu: bool = False
    report_every_s: float = DEFAULT_REPORT_EVERY_S
    spin_us: int = 0

    @property
    def gpu_direct_requested(self) -> bool:
        return self.ais == "1" or (self.ais == "auto" and bool(self.hipfile_roots))


# -- the parsers: each takes the variable's text (None when unset) and raises UsageError ---------
def parse_socket(text: str | None) -> str | None:
    """``INFERA_KVD_SOCKET``: any path; unset or empty means the per-user default."""
    return text or None


def parse_ais(text: str | None) -> str:
    value = (text or "0").strip().lower()
    if value not in ("0", "1", "auto"):
        raise UsageError(f"{AIS_ENV}={text!r} must be 0, 1 or auto")
    return value


def parse_roots(text: str | None) -> dict[str, str]:
    """``name=path[,name=path]`` as in the product doc (e.g. ``long=/nvme/kvd-long``), each name once."""
    roots: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise UsageError(
                f"{ROOTS_ENV} entry {item!r} is not name=path",
                hint=f"e.g. {ROOTS_ENV}=long=/nvme/kvd-long",
            )
        if name in roots:
            raise UsageError(
                f"{ROOTS_ENV} names the root {name!r} twice ({roots[name]} and {path})",
                hint="give each root one path",
            )
        roots[name] = path
    return roots


def parse_staging_mb(text: str | None) -> int:
    """``INFERA_KVD_GPU_STAGING_MB``: MiB of GPU staging for the GPU copy path, as bytes."""
    if text is None or not text.strip():
        return DEFAULT_STAGING_MB << 20
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{STAGING_ENV}={text!r} is not a whole number of MiB") from None
    if value < 1:
        raise UsageError(f"{STAGING_ENV} must be at least 1 (got {value})")
    return value << 20


def parse_copy_kernel(text: str | None) -> str:
    value = (text or "auto").strip().lower() or "auto"
    if value not in ("auto", "triton", "torch"):
        raise UsageError(f"{COPY_KERNEL_ENV}={text!r} must be auto, triton or torch")
    return value


def parse_load_policy(text: str | None) -> str:
    value = (text or DEFAULT_POLICY).strip().lower() or DEFAULT_POLICY
    if value not in POLICIES:
        raise UsageError(f"{LOAD_POLICY_ENV}={text!r} must be auto, always or never")
    return value


def parse_load_rates(text: str | None) -> tuple[dict[str, float], float | None]:
    """``ram=GB/s,disk=GB/s,distributed=GB/s,prefill=tokens/s`` (any subset, each name once) as
    (load GB/s by tier, prefill tokens/s or None)."""
    gbps: dict[str, float] = {}
    prefill: float | None = None
    seen: set[str] = set()
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not (number > 0 and math.isfinite(number)):
            raise UsageError(f"{LOAD_RATES_ENV}: entry {item!r} is not name=positive number", hint=RATES_HINT)
        if name not in RATE_NAMES:
            raise UsageError(
                f"{LOAD_RATES_ENV}: entry {item!r}: {name!r} is not one of {', '.join(RATE_NAMES)}",
                hint=RATES_HINT,
            )
        if name in seen:
            raise UsageError(f"{LOAD_RATES_ENV}: {name} is set twice in {text!r}", hint=RATES_HINT)
        seen.add(name)
        if name == "prefill":
            prefill = number
        else:
            gbps[name] = number
    return gbps, prefill


def parse_flag(name: str, text: str | None, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{name}={text!r} must be 0 or 1")


def parse_report_every(text: str | None) -> float:
    """``INFERA_KVD_REPORT_EVERY_S``: seconds between REPORTs, 0 or more (0: after every step)."""
    if text is None or not text.strip():
        return DEFAULT_REPORT_EVERY_S
    hint = f"e.g. {REPORT_EVERY_ENV}=5 (the default); 0 reports after every step"
    try:
        value = float(text.strip())
    except ValueError:
        raise UsageError(f"{REPORT_EVERY_ENV}={text!r} is not a number of seconds", hint=hint) from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(
            f"{REPORT_EVERY_ENV}={text!r} must be a finite number of seconds, 0 or more", hint=hint
        )
    return value


def _flag(name: str, default: bool) -> Callable[[str | None], bool]:
    return lambda text: parse_flag(name, text, default)


# -- the table ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variable:
    """One ``INFERA_KVD_*`` variable: its parser, and its default and meaning as docs/engine.md
    shows them (markdown, one table cell each)."""

    name: str
    parse: Callable[[str | None], Any]
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable(
        SOCKET_ENV,
        parse_socket,
        "`$XDG_RUNTIME_DIR/infera-kvd.sock`, else `/tmp/infera-kvd-<uid>/kvd.sock`",
        "the daemon's socket; `--kvd-socket-path` sets it when it is unset",
    ),
    Variable(
        CHUNK_TOKENS_ENV,
        parse_chunk_tokens,
        "`auto`",
        "tokens per chunk, `auto` or a positive number (rounded up to whole blocks); see "
        "[connector.md](connector.md#chunk-size-infera_kvd_chunk_tokensauto)",
    ),
    Variable(
        AIS_ENV,
        parse_ais,
        "`0`",
        "`0`, `1` or `auto`: GPU-direct reads and writes of the disk tier's chunk files, and chunks "
        "sized for them ([gpu.md](gpu.md))",
    ),
    Variable(
        ROOTS_ENV,
        parse_roots,
        "none",
        "`name=path[,name=path]`, each name once: the directories of GPU-direct chunk files by "
        "long tier (`long=` the daemon's `--long-path`; [gpu.md](gpu.md))",
    ),
    Variable(
        STAGING_ENV,
        parse_staging_mb,
        f"`{DEFAULT_STAGING_MB}`",
        "MiB of GPU staging for the GPU copy path (3/4 for loads, 1/4 for saves), at least 1",
    ),
    Variable(
        REGISTER_ENV,
        _flag(REGISTER_ENV, True),
        "`1`",
        "`0` skips registering the arena with the GPU (diagnostics only: copies run at pageable-memory "
        "speed, reported as a fallback)",
    ),
    Variable(
        COPY_KERNEL_ENV,
        parse_copy_kernel,
        "`auto`",
        "`auto`, `triton` or `torch`: how pages move between KV blocks and GPU staging ([gpu.md](gpu.md))",
    ),
    Variable(
        LOAD_POLICY_ENV,
        parse_load_policy,
        f"`{DEFAULT_POLICY}`",
        "`always`, `auto` (load a hit only where that beats recomputing it) or `never`; see "
        "[connector.md](connector.md#load-policy-load-a-hit-only-where-that-beats-recompute)",
    ),
    Variable(
        LOAD_RATES_ENV,
        parse_load_rates,
        "the warm-up defaults",
        "`ram=GB/s,disk=GB/s,distributed=GB/s,prefill=tokens/s`, any subset, each name once: the "
        "load policy's rates until it has measured them",
    ),
    Variable(
        LAYERWISE_ENV,
        _flag(LAYERWISE_ENV, False),
        "`0`",
        "`1` copies each layer's KV when vLLM waits for that layer "
        "([connector.md](connector.md#layer-wise-loads-infera_kvd_load_layerwise1))",
    ),
    Variable(
        GPU_PATH_ON_CPU_ENV,
        _flag(GPU_PATH_ON_CPU_ENV, False),
        "`0`",
        "`1` runs the GPU copy path's code on an engine whose KV is on the CPU (tests and dry runs only)",
    ),
    Variable(
        REPORT_EVERY_ENV,
        parse_report_every,
        f"`{DEFAULT_REPORT_EVERY_S:g}`",
        "seconds between the counter reports each half sends the daemon (`kvd stat`), 0 or more; "
        "`0` reports after every step (benchmarks)",
    ),
    Variable(
        SPIN_ENV,
        parse_spin_us,
        "`0`",
        f"microseconds a daemon connection polls for a reply before it blocks, 0 to {MAX_SPIN_US}",
    ),
)
BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}


def check_value(name: str, text: str | None) -> UsageError | None:
    """Why the connector refuses ``text`` for the variable ``name`` (None when it takes it, or
    when ``name`` is not one of :data:`VARIABLES`)."""
    var = BY_NAME.get(name)
    if var is None:
        return None
    try:
        var.parse(text)
    except UsageError as err:
        return err
    return None


def read_env(environ: Mapping[str, str] | None = None) -> ConnectorEnv:
    """Every variable of :data:`VARIABLES`, parsed; the first refused value raises UsageError."""
    env = os.environ if environ is None else environ
    got = {v.name: v.parse(env.get(v.name)) for v in VARIABLES}
    gbps, prefill = got[LOAD_RATES_ENV]
    return ConnectorEnv(
        socket=got[SOCKET_ENV],
        chunk_tokens=got[CHUNK_TOKENS_ENV],
        ais=got[AIS_ENV],
        hipfile_roots=got[ROOTS_ENV],
        gpu_staging_bytes=got[STAGING_ENV],
        register=got[REGISTER_ENV],
        copy_kernel=got[COPY_KERNEL_ENV],
        load_policy=got[LOAD_POLICY_ENV],
        load_gbps=gbps,
        prefill_tps=prefill,
        load_layerwise=got[LAYERWISE_ENV],
        gpu_path_on_cpu=got[GPU_PATH_ON_CPU_ENV],
        report_every_s=got[REPORT_EVERY_ENV],
        spin_us=got[SPIN_ENV],
    )


def docs_table() -> str:
    """The variables as docs/engine.md's table shows them (a test keeps the page equal to it)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)


def layerwise_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``INFERA_KVD_LOAD_LAYERWISE`` asks for layer-wise loads, for vLLM's config check
    (before the connector exists). A value the connector will refuse counts as yes: the safe
    answer keeps the CUDA graphs piecewise until the connector's own error stops the engine."""
    env = os.environ if environ is None else environ
    try:
        return parse_flag(LAYERWISE_ENV, env.get(LAYERWISE_ENV), False)
    except UsageError:
        return True


# -- kv_connector_extra_config ------------------------------------------------------------------
def extra_config_notice(extra: Mapping[str, Any] | None) -> str | None:
    """What to say about the connector's ``kv_connector_extra_config``: it reads none of it (its
    settings are the variables above), so every key is named, with the variable to use where one
    matches; None when there are no keys."""
    if not extra:
        return None
    parts = []
    for key in sorted(map(str, extra)):
        var = "INFERA_KVD_" + key.strip().upper().removeprefix("INFERA_KVD_")
        parts.append(f"{key} (use {var})" if var in BY_NAME else key)
    return (
        "kv_connector_extra_config is not read by InferaKvdConnector (it is configured by INFERA_KVD_* "
        f"environment variables, see docs/engine.md); ignored: {', '.join(parts)}"
    )
