"""Byte sizes and durations as users type them: ``512M``, ``16G``, ``1T``, ``300s``, ``5m``.

Sizes use binary units (``1K`` = 1024 bytes); an optional trailing ``B``/``iB`` is accepted
(``16GiB``, ``16GB`` and ``16G`` are all 16 * 2**30). Bad input raises :class:`UsageError` with a
one-line message that names the flag. :func:`refresh_interval` is the one range of the tools that
poll a daemon again and again (``kvd top --interval``, ``kvd stat --watch``).
"""

from __future__ import annotations

import re

from infera.errors import UsageError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(text: str | int, flag: str = "size") -> int:
    """Parse ``text`` as a byte count; raise UsageError naming ``flag`` when it is not one."""
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"{flag}: size must not be negative (got {text})")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(
            f"{flag}: {text!r} is not a size",
            hint="use a number with an optional binary unit, e.g. 512M, 16G, 1T",
        )
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    return int(value)


def format_size(n: float) -> str:
    """Render a byte count with a binary unit, e.g. ``4.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover - loop always returns


REFRESH_MIN_S = 0.1  # a tool polling faster than this floods the daemon with connections
REFRESH_MAX_S = 3600.0


def refresh_interval(seconds: float, flag: str) -> float:
    """``seconds`` between two polls of a daemon, checked: 0.1 to 3600 (NaN and infinities are out
    of range too); UsageError naming ``flag`` otherwise."""
    if not REFRESH_MIN_S <= seconds <= REFRESH_MAX_S:
        raise UsageError(
            f"{flag}: {seconds:g} is out of range",
            hint=f"use between {REFRESH_MIN_S:g} and {REFRESH_MAX_S:g} seconds",
        )
    return float(seconds)


def parse_duration(text: str | float, flag: str = "duration") -> float:
    """Parse ``300``, ``300s``, ``5m``, ``250ms`` into seconds."""
    if isinstance(text, int | float):
        return float(text)
    m = _DUR_RE.match(str(text))
    if not m:
        raise UsageError(f"{flag}: {text!r} is not a duration", hint="use e.g. 300s, 5m, 1h")
    return float(m.group(1)) * _DUR_UNITS[(m.group(2) or "s").lower()]
