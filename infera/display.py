"""Showing on a terminal what a daemon or its clients sent: safely and whatever its type.

Everything ``kvd stat`` and ``kvd top`` print comes from a STATS reply, and much of it from
clients: any process that says HELLO chooses its ``name``, ``model``, ``role``, namespace and
hash settings, and REPORT adds data paths and fallback reasons. Two rules hold for all of it:

* :func:`printable`: control characters never reach the terminal as they are. An escape sequence
  in a client's name could clear the screen or move the cursor and forge a line; a newline would
  split a table row. Each one is written as its escape (``\\x1b``, ``\\n``, ``\\u202e``): C0 and C1
  controls, DEL, line and paragraph separators, and the bidirectional overrides that reorder what
  follows them. Other text is left as it is.
* :func:`number`, :func:`count`, :func:`mapping`, :func:`items` and :func:`size`: a field of an unexpected type
  (a newer or an odd server, a fake one) is shown as absent, never as an exception. A number is an
  ``int`` or a finite ``float`` (``bool`` is not one); anything else is ``None``.

Part of the contract layer: the tools share it and it imports nothing of ours but units.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any

from infera.units import format_size

ABSENT = "?"  # how a field of the wrong type is shown

# format characters that reorder the text after them (a "Trojan source" line); other format
# characters (zero-width joiners of emoji, soft hyphens) are harmless and kept
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ESCAPED_CATEGORIES = frozenset(("Cc", "Zl", "Zp"))


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """``str(value)`` with every control character escaped (see the module docstring)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to look at twice
        return text
    return "".join(
        _escape(ch)
        if ch in _BIDI or (not ch.isprintable() and unicodedata.category(ch) in _ESCAPED_CATEGORIES)
        else ch
        for ch in text
    )


def number(value: Any) -> int | float | None:
    """``value`` if it is an int or a finite float (not a bool), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def count(value: Any, default: int = 0) -> int:
    """A counter as a whole number: ``value`` truncated when it is a number, else ``default``."""
    n = number(value)
    return int(n) if n is not None else default


def mapping(value: Any) -> Mapping[Any, Any]:
    """``value`` if it is a map, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def items(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def size(value: Any) -> str:
    """A byte count with its unit (``4.0 MiB``), or :data:`ABSENT` when it is not a number."""
    n = number(value)
    return format_size(n) if n is not None else ABSENT


__all__ = ["ABSENT", "count", "items", "mapping", "number", "printable", "size"]
