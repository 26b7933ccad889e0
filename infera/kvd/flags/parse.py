"""Validators of the daemon's flags: (value as typed, flag name) -> the value the daemon uses, or a UsageError naming the flag."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from infera.errors import UsageError
from infera.units import parse_duration, parse_size

LONG_BACKENDS = ("disk", "mooncake", "lmcache")
DISTRIBUTED = ("mooncake", "lmcache")
MIN_ARENA = 1 << 20
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, and Python wants room for the final NUL
METADATA_SCHEMES = ("http://", "https://", "etcd://", "redis://")

Kind = Literal["value", "list", "switch"]
Parse = Callable[[Any, str], Any]


class _Unknown:
    """A value a tool cannot see (a ``$VAR`` of the caller, a Kubernetes ``valueFrom``)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


# -- validators: (value as typed, flag name) -> the value the daemon uses; UsageError naming the flag --


def size(minimum: int = 0, label: str = "") -> Parse:
    def parse(value: Any, flag: str) -> int:
        n = parse_size(value, flag)
        if n < minimum:
            raise UsageError(f"{flag}: {value} is below the {label} minimum")
        return n

    return parse


def choice(names: tuple[str, ...], upper: bool = False) -> Parse:
    listed = f"{names[0]} or {names[1]}" if len(names) == 2 else f"one of {', '.join(names)}"

    def parse(value: Any, flag: str) -> str:
        text = str(value).lower()
        if text not in names:
            raise UsageError(f"{flag}: {value!r} is not {listed}")
        return text.upper() if upper else text

    return parse


def int_range(lo: int, hi: int) -> Parse:
    def parse(value: Any, flag: str) -> int:
        text = str(value).strip()
        if not re.fullmatch(r"-?\d+", text) or not lo <= int(text) <= hi:
            raise UsageError(f"{flag}: {value!r} is not a whole number between {lo} and {hi}")
        return int(text)

    return parse


def percent(value: Any, flag: str) -> int:
    """A whole percentage 1-100, with or without its ``%``."""
    text = str(value).strip().removesuffix("%").strip()
    if not re.fullmatch(r"\d+", text) or not 1 <= int(text) <= 100:
        raise UsageError(f"{flag}: {value!r} is not a percentage between 1 and 100")
    return int(text)


def tcp_port(value: Any, flag: str) -> int:
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"{flag}: {value} is not a TCP port")
    return int(text)


def duration(value: Any, flag: str) -> float:
    return parse_duration(value, flag)


def octal_mode(value: Any, flag: str) -> int:
    try:
        mode = int(str(value), 8)
    except ValueError:
        raise UsageError(f"{flag}: {value!r} is not an octal mode", hint="e.g. 0660 or 0600") from None
    if not 0 <= mode <= 0o777:
        raise UsageError(f"{flag}: {value!r} is out of range")
    return mode


def text(value: Any, flag: str) -> str:
    return str(value)


def directory(value: Any, flag: str) -> str:
    return os.path.expanduser(str(value))


def socket_path(value: Any, flag: str) -> str:
    n = len(os.fsencode(str(value)))
    if n > MAX_SOCKET_PATH:
        raise UsageError(
            f"{flag}: the path is {n} bytes; a Unix socket path has at most {MAX_SOCKET_PATH}",
            hint="use a shorter directory, e.g. /run/infera-kvd.sock",
        )
    return str(value)


_USER = re.compile(r"[A-Za-z0-9_.@][A-Za-z0-9_.@-]*\$?")


@dataclass(frozen=True)
class Uids:
    """``--allow-uid`` values: numeric uids, user names (resolved on the daemon's host), or anyone."""

    uids: frozenset[int] = frozenset()
    names: tuple[str, ...] = ()
    anyone: bool = False


def uid_list(values: Any, flag: str) -> Uids:
    uids: set[int] = set()
    names: list[str] = []
    anyone = False
    for raw in [values] if isinstance(values, str) else values:
        for item in (i.strip() for i in str(raw).split(",")):
            if not item:
                continue
            if item == "*":
                anyone = True
            elif item.isdigit():
                uids.add(int(item))
            elif _USER.fullmatch(item):
                names.append(item)
            else:
                raise UsageError(f"{flag}: {item!r} is not a uid, a user name or '*'")
    return Uids(frozenset(uids), tuple(names), anyone)


def parse_master(master: str) -> tuple[str, int]:
    """(host, port) of a Mooncake master: ``HOST:PORT``, or the first endpoint of ``etcd://A,B`` (``,`` or ``;``).
    Any other scheme (``http://`` is the metadata server's) is refused: Mooncake rejects it on every try."""
    scheme, sep, rest = master.partition("://")
    if sep and scheme.lower() != "etcd":
        raise UsageError(
            f"--mooncake-master: {master!r} is not HOST:PORT or etcd://HOST:PORT (the master's RPC address; "
            "an http://…/metadata URL belongs in --mooncake-metadata)"
        )
    target = rest if sep else master
    target = re.split(r"[,;]", target, maxsplit=1)[0]
    host, sep, port = target.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--mooncake-master: {master!r} is not HOST:PORT", hint="e.g. 10.0.0.5:50051")
    return host.strip("[]"), int(port)


def master_address(value: Any, flag: str) -> str:
    parse_master(str(value))
    return str(value)


def metadata_url(value: Any, flag: str) -> str:
    meta = str(value)
    if meta != "P2PHANDSHAKE" and not meta.startswith(METADATA_SCHEMES):
        raise UsageError(
            f"{flag}: {meta!r} is not a metadata service URL",
            hint="http://HOST:PORT/metadata (the master's --enable_http_metadata_server), "
            "etcd://HOST:PORT, redis://HOST:PORT or P2PHANDSHAKE",
        )
    return meta


def lm_url(value: Any, flag: str) -> str:
    url = str(value)
    rest = url[len("lm://") :] if url.startswith("lm://") else None
    host, sep, port = (rest or "").rpartition(":")
    if rest is None or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag}: {url!r} is not lm://HOST:PORT", hint="e.g. lm://10.0.0.5:65432")
    return url


def switch(value: Any, flag: str) -> bool:
    return bool(value)
