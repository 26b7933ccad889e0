"""The one command runner: every external command a check runs goes through :class:`CommandRunner`.

Programs come from ``PATH``; a caller may name extra locations under the host root that are
tried first (``<root>/opt/rocm/bin/ais-check``). Results are cached by argument list, never
raise, and carry a reason when the command could not run (not installed, timed out, denied).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infera.doctor.host import HostView

DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and returned, or why it did not run (``error``)."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    error: str | None = None

    @property
    def ran(self) -> bool:
        return self.error is None

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    @property
    def missing(self) -> bool:
        return self.error == "not installed"

    @property
    def line(self) -> str:
        """The command as a user would type it (program by its base name unless it came from the root)."""
        return shlex.join(self.argv)

    def describe(self) -> str:
        if self.error:
            return f"{self.line}: {self.error}"
        return f"{self.line} (exit {self.returncode})"

    def first_error_line(self) -> str:
        for line in (self.stderr + "\n" + self.stdout).splitlines():
            if line.strip():
                return line.strip()
        return ""


class CommandRunner:
    """Runs host commands with a timeout, a C locale and a cache."""

    def __init__(
        self,
        host: HostView,
        *,
        path: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.path = path if path is not None else os.environ.get("PATH", os.defpath)
        self.timeout = timeout
        base = dict(env if env is not None else os.environ)
        base.update({"LC_ALL": "C", "LANG": "C"})
        self.env = base
        self._cache: dict[tuple[str, ...], CommandResult] = {}

    def which(self, name: str, also: Sequence[str] = ()) -> str | None:
        """Where ``name`` would run from: host-root locations in ``also`` first, then ``PATH``."""
        found = self._locate(name, also)
        return found[0] if found else None

    def _locate(self, name: str, also: Sequence[str]) -> tuple[str, str] | None:
        """(real executable, how evidence names it)."""
        for p in also:
            real = self.host.path(p)
            if real.is_file() and os.access(real, os.X_OK):
                return str(real), p
        exe = shutil.which(name, path=self.path)
        return (exe, name) if exe else None

    def run(
        self,
        argv: Sequence[str],
        *,
        also: Sequence[str] = (),
        timeout: float | None = None,
    ) -> CommandResult:
        key = tuple(argv)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        res = self._run(key, also, timeout or self.timeout)
        self._cache[key] = res
        return res

    def _run(self, argv: tuple[str, ...], also: Sequence[str], timeout: float) -> CommandResult:
        found = self._locate(argv[0], also)
        if found is None:
            return CommandResult(argv, None, "", "", "not installed")
        exe, display = found
        full = (exe, *argv[1:])
        shown = (display, *argv[1:])
        try:
            proc = subprocess.run(
                list(full),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                env=self.env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return CommandResult(shown, None, "", "", f"timed out after {timeout:g} s")
        except PermissionError:
            return CommandResult(shown, None, "", "", "permission denied")
        except FileNotFoundError:
            return CommandResult(shown, None, "", "", "not installed")
        except OSError as exc:
            return CommandResult(shown, None, "", "", exc.strerror or str(exc))
        return CommandResult(
            shown,
            proc.returncode,
            _text(proc.stdout),
            _text(proc.stderr),
        )


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")
