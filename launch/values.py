"""Checks of the values ``kvd launch`` writes into commands: hosts, endpoints, paths, names, versions.

Each check takes the value and where it came from (a flag such as ``--advertise-host``, or a spec
field such as ``daemon.socket``) and returns the value or raises a one-line :class:`UsageError`
naming that place. An option and the spec field that mirrors it go through the same check, and a
value the engine, the daemon or ``kvd lint`` would refuse is refused here first.
"""

from __future__ import annotations

import ipaddress
import re

from infera.errors import UsageError
from infera.kvd.flags.parse import tcp_port
from infera.versions import major_minor

# a DNS name (RFC 1123 labels; ``_`` too, as resolvers accept it) or an IP address
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_WILDCARDS = ("0.0.0.0", "::")

__all__ = [
    "absolute_path",
    "endpoint",
    "host",
    "name",
    "not_empty",
    "port_clash",
    "routable",
    "tcp_port",
    "vllm_version",
]


def not_empty(value: str | None, flag: str, what: str) -> str | None:
    """``value`` stripped; None when not given; an error when given but blank (``--model ''``)."""
    if value is None:
        return None
    if not str(value).strip():
        raise UsageError(f"{flag} is empty: give {what}")
    return str(value).strip()


def host(value: str, flag: str) -> str:
    """An IP address (IPv6 with or without brackets) or a DNS name."""
    text = value.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(bare)
        return text
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if text and len(text) <= 253 and all(_LABEL.fullmatch(label) for label in labels):
        return text
    raise UsageError(f"{flag}: {value!r} is not a host name or an IP address")


def routable(value: str, flag: str) -> str:
    """A host another machine can reach: not loopback, not a wildcard."""
    text = host(value, flag)
    bad = text.lower() in ("localhost", *_WILDCARDS)
    try:
        addr = ipaddress.ip_address(text.strip("[]"))
        bad = bad or addr.is_loopback or addr.is_unspecified
    except ValueError:
        pass
    if bad:
        raise UsageError(
            f"{flag}: {text} is not routable from another host",
            hint="use the address the other leg reaches this host on",
        )
    return text


def endpoint(value: str, flag: str) -> str:
    """``HOST:PORT`` or ``[IPv6]:PORT``, the port spelled out and in 1..65535 (like ``--port``)."""
    text = value.strip()
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d+)", text)
    if m is None:
        raise UsageError(f"{flag}: {value!r} is not HOST:PORT")
    host(m.group(1), flag)
    tcp_port(m.group(2), flag)
    return text


def absolute_path(value: str, flag: str) -> str:
    if not str(value).startswith("/"):
        raise UsageError(f"{flag}: {value!r} is not an absolute path")
    return str(value)


def name(value: str, flag: str) -> str:
    """A word such as a transport name: letters, digits and ``_ . + -``, no spaces."""
    text = value.strip()
    if not text:
        raise UsageError(f"{flag} is empty: give a name")
    if not _NAME.fullmatch(text):
        raise UsageError(f"{flag}: {value!r} is not a name (letters, digits, _ . + -)")
    return text


def vllm_version(text: str | None, flag: str = "--vllm-version") -> tuple[int, int] | None:
    """A vLLM version as the rules compare it, (major, minor); None when not given.

    ``kvd launch --vllm-version``, the spec's ``vllm_version`` and ``kvd lint --vllm-version`` take
    the same values: ``0.32``, ``0.32.1``, ``v0.32.0+cpu``.
    """
    if text is None or str(text) == "":
        return None
    version = major_minor(str(text))
    if version is None:
        raise UsageError(f"{flag}: {str(text)!r} is not a version like 0.32")
    return version


def port_clash(ports: list[tuple[str, int | None, str, str]]) -> None:
    """``ports`` holds (host, port, flag, owner) of everything that listens, in the order the flags
    are read; a port that two owners on one host share is refused, naming the later one's flag:
    ``--decode-port: 8001 is taken by the prefill leg on the same host``."""
    seen: dict[tuple[str, int], str] = {}
    for where, port, flag, owner in ports:
        if port is None:
            continue
        key = (where.strip("[]").lower(), int(port))
        if key in seen:
            raise UsageError(f"{flag}: {port} is taken by {seen[key]} on the same host")
        seen[key] = owner
