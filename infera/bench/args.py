"""The argument checks every ``kvd bench`` command shares.

Each check raises a one-line :class:`~infera.errors.UsageError` naming the flag (exit status 2),
and each benchmark runs its checks before it starts anything (a daemon, a store, an engine), so a
bad flag is refused at once, not after minutes or with a traceback from deep inside a run.

* :func:`at_least`: a count (``--rounds``, ``--repeat``, ...) of at least ``minimum``;
* :func:`above_zero`: an amount with a fraction (``--native-cpu-gb``);
* :func:`size_at_least`: a byte size as users type it (``4M``), parsed by
  :func:`infera.units.parse_size`, of at least ``minimum`` bytes;
* :func:`one_of`: a word from a fixed list (``--fsync``, ``--device``);
* :func:`results_dir`: a directory the results go to (``--out``), made when missing;
* :func:`executable`: a program the benchmark runs (``--python``);
* :func:`vllm_python`: a Python that can import vLLM (``bench ttft``, ``gpu-e2e``, ``compare``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from infera.errors import UsageError
from infera.units import parse_size

N = TypeVar("N", int, float)

#: the vLLM environment the hints name (scripts/setup.sh --all makes it)
VLLM_VENV_PYTHON = ".venv-vllm032/bin/python"


def at_least(value: N, flag: str, minimum: N = 1) -> N:
    """``value`` when it is at least ``minimum``; else ``--flag must be at least MINIMUM``."""
    if value < minimum:
        raise UsageError(f"{flag} must be at least {minimum} (got {value})")
    return value


def above_zero(value: float, flag: str) -> float:
    """``value`` when it is above 0 (an amount that may have a fraction: ``--native-cpu-gb 0.5``)."""
    if not value > 0:
        raise UsageError(f"{flag} must be above 0 (got {value:g})")
    return value


def size_at_least(text: str | int, flag: str, minimum: int = 1) -> int:
    """The byte count of ``text`` (``512K``, ``4M``); it must be at least ``minimum`` bytes."""
    n = parse_size(text, flag)
    if n < minimum:
        raise UsageError(f"{flag} must be at least {minimum} (got {text})")
    return n


def one_of(value: str, flag: str, names: Sequence[str]) -> str:
    """``value`` when it is one of ``names``; else a one-line error listing them."""
    if value not in names:
        raise UsageError(f"{flag}: {value!r} is not one of {', '.join(names)}")
    return value


def results_dir(out: str, flag: str = "--out") -> Path:
    """The directory ``out``, made if missing; it must be a directory this user can write."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag}: {out} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot create {out}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"{flag}: {out} is not writable")
    return path


def executable(path: str, flag: str) -> str:
    """``path`` when it names a program that can run: a path, or a name found on ``$PATH``."""
    found = path if os.sep in path else shutil.which(path)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise UsageError(f"{flag}: {path} does not exist (or is not executable)")
    return path


def vllm_python(python: str | None, flag: str = "--python") -> str:
    """``python`` (default: this Python) when it exists and can import vLLM; the benchmark's
    engines run in it."""
    if python is None or python == sys.executable:
        if importlib.util.find_spec("vllm") is None:
            raise UsageError(
                "vLLM is not installed in this Python",
                hint=f"pass {flag} with a vLLM environment, e.g. {flag} {VLLM_VENV_PYTHON}",
            )
        return sys.executable
    executable(python, flag)
    code = "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        probe = subprocess.run([python, "-c", code], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{flag}: cannot run {python} ({exc})") from None
    if probe.returncode != 0:
        raise UsageError(f"{python} cannot import vllm", hint=f"point {flag} at a vLLM environment")
    return python


__all__ = ["above_zero", "at_least", "executable", "one_of", "results_dir", "size_at_least", "vllm_python"]
