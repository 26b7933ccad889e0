"""The daemon's settings that are environment variables only (``INFERA_KVD_DISK_WRITERS`` and the
like), in one table: each one's name, what it takes and the tier that reads it.

:func:`check` reads every one a configuration uses when the configuration is built
(:func:`infera.kvd.config.build_config`), so a bad value is one line naming the variable and what
it takes (a :class:`UsageError`, exit status 2) before the daemon starts; the code that uses one
reads it with :func:`read`. An unset or empty variable is the caller's default. A variable of a tier
the daemon does not run is not read at all, as flags of another ``--long-backend`` are not.

The daemon's flags have environment variables of their own (``INFERA_KVD_MAX_BYTES``...): those are
the flag table's (:mod:`infera.kvd.flags`), checked with the flags.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from infera.errors import UsageError


@dataclass(frozen=True)
class EnvVar:
    """One variable: a whole number (``integer``) or a number of seconds, from ``lo`` to ``hi``."""

    name: str
    integer: bool
    lo: float
    hi: float
    what: str  # what it sets, for the error's hint
    backend: str | None = "disk"  # the long tier that reads it (None: any daemon)

    def takes(self) -> str:
        if self.integer:
            return f"a whole number from {self.lo:g} to {self.hi:g}"
        return f"a number of seconds from {self.lo:g} to {self.hi:g}"

    def parse(self, text: str) -> int | float:
        """The value of ``text``, or a UsageError naming the variable and what it takes."""
        value: float | None = None
        stripped = text.strip()
        if self.integer:
            if re.fullmatch(r"[+-]?\d+", stripped):
                value = int(stripped)
        else:
            try:
                value = float(stripped)
            except ValueError:
                value = None
        if value is None or not math.isfinite(value) or not self.lo <= value <= self.hi:
            raise UsageError(
                f"{self.name}: {text!r} is not {self.takes()}",
                hint=f"it sets {self.what}; unset it for the default",
            )
        return value


VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar("INFERA_KVD_DISK_WRITERS", True, 1, 64, "the disk tier's writer threads"),
        EnvVar("INFERA_KVD_DISK_READERS", True, 1, 64, "the disk tier's reader threads"),
        EnvVar("INFERA_KVD_DISK_RETRY_S", False, 0.01, 3600, "the first retry delay of a failed disk write"),
        EnvVar("INFERA_KVD_DISK_STOP_S", False, 0, 3600, "how long a clean stop may spend writing to disk"),
        EnvVar("INFERA_KVD_DISK_DIRECT", True, 0, 1, "whether disk reads use O_DIRECT (1) or not (0)"),
        # test knobs: a slow disk, an early checkpoint rewrite, a slow index load
        EnvVar("INFERA_KVD_TEST_WRITE_DELAY_S", False, 0, 3600, "a delay before each disk write (tests)"),
        EnvVar(
            "INFERA_KVD_TEST_CHECKPOINT_RECORDS", True, 1, 1 << 40, "journal records per checkpoint (tests)"
        ),
        EnvVar(
            "INFERA_KVD_TEST_CHECKPOINT_DELAY_S", False, 0, 3600, "a delay in a checkpoint rewrite (tests)"
        ),
        EnvVar("INFERA_KVD_TEST_LOAD_DELAY_S", False, 0, 3600, "a delay before the index load (tests)"),
    )
}


def read(name: str) -> int | float | None:
    """The value of variable ``name`` of :data:`VARS`; None when it is unset or empty."""
    text = os.environ.get(name, "")
    if not text.strip():
        return None
    return VARS[name].parse(text)


def get(name: str, default: float) -> float:
    """:func:`read`, with ``default`` for a variable that is unset or empty."""
    value = read(name)
    return default if value is None else value


def check(backend: str | None) -> None:
    """Read every variable the daemon with this long tier reads (``backend``: its name, or None for
    RAM only); the first bad one is a UsageError."""
    for var in VARS.values():
        if var.backend is None or var.backend == backend:
            read(var.name)


__all__ = ["VARS", "EnvVar", "check", "get", "read"]
