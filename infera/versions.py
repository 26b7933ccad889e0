"""Version strings as tools and packages print them: ``0.32.0+cpu``, ``v0.29``, ``6.16.13-2278356.24.04``.

One parser for every version the project compares (vLLM releases in the connector, doctor and lint;
amdgpu, DKMS and ROCm versions in doctor and the GPU-direct selection). Only the leading dotted
integers count; what follows (a local build tag, a DKMS build number) is the caller's business.

Part of the contract layer (docs/design.md, "Layers"): it imports nothing of ours.
"""

from __future__ import annotations

import re

Version = tuple[int, ...]

_LEADING = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def parse_version(text: str | None) -> Version | None:
    """Leading dotted integers: ``"6.16.13-2278356.24.04"`` -> ``(6, 16, 13)``; None when there are none."""
    if not text:
        return None
    m = _LEADING.match(str(text))
    if not m:
        return None
    return tuple(int(x) for x in m.group(1).split("."))


def major_minor(text: str | None) -> tuple[int, int] | None:
    """``0.29``, ``0.26.0``, ``v0.32.0+cpu`` -> (major, minor); None when absent or without a minor."""
    v = parse_version(text)
    return (v[0], v[1]) if v is not None and len(v) >= 2 else None


def vstr(v: Version | None) -> str:
    """``(6, 16, 6)`` -> ``"6.16.6"``; ``"?"`` for None."""
    return ".".join(str(x) for x in v) if v else "?"
