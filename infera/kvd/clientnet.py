"""Connecting to a kvd daemon one can trust, and the errors a client raises.

What the client verifies before it trusts a daemon (one ``getsockopt`` and one ``fstat`` plus one
``fcntl`` on top of the connect and HELLO round trip):

* **who listens** (``SO_PEERCRED``, right after connect, before any byte is sent): the listener's
  uid must be this process's own uid, root, or one of ``trust_uids=`` / ``$INFERA_KVD_TRUST_UID``
  (comma-separated uids or user names). Anything else is :class:`KvdUntrusted`: another local
  user's socket at a predictable path would otherwise receive every stored chunk and feed back
  bytes of its choosing.
* **the arena** passed at HELLO: a memfd whose size is sealed (``F_SEAL_SHRINK | F_SEAL_GROW``,
  read with ``F_GET_SEALS``), at least as large as the announced ``arena_size``, and mappable.
  An unsealed descriptor could be shrunk under the mapping (SIGBUS on the next access); only a
  fake or outdated daemon sends one. Any failure is :class:`KvdArenaError`.
* **a full accept queue** is not a failure: a connect refused with EAGAIN (hundreds of engines
  connecting in one busy second, or a daemon paused for a moment) is retried with a short
  backoff until ``timeout``. ECONNREFUSED (nobody listens) fails at once.

It does not check the bytes a trusted daemon serves: every client the daemon serves can write
the whole arena (docs/daemon.md, "Security model").
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Iterable
from typing import Any

from infera.errors import KvdError, UsageError
from infera.kvd.protocol import peer_cred


class KvdClientError(KvdError):
    """Base of every error the client raises."""


class KvdUnavailable(KvdClientError):
    """The daemon cannot be reached (not running, wrong socket, connection lost)."""


class KvdRefused(KvdClientError):
    """The daemon refused this process (its uid is not allowed)."""


class KvdProtocolError(KvdClientError):
    """The daemon answered with something this client does not understand, or a typed error."""

    def __init__(self, message: str, code: str = "bad_request", hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.code = code


class KvdFull(KvdClientError):
    """The arena cannot hold the chunk even after evicting everything evictable."""


class KvdQuota(KvdFull):
    """This connection already pins its share of the arena (the daemon's ``--client-quota``):
    release leases, seal reservations or let holds end first. Other clients can still write."""


class KvdUnsupported(KvdProtocolError):
    """The daemon does not offer this feature in its current configuration."""


class KvdUntrusted(KvdClientError):
    """The process listening on the socket runs as a uid this client does not trust."""


class KvdArenaError(KvdClientError):
    """The arena descriptor the daemon passed at HELLO is unusable (unsealed, short, unmappable)."""


TRUST_ENV = "INFERA_KVD_TRUST_UID"
CONNECT_BACKOFF_MAX_S = 0.05  # longest pause between two connect attempts on a full accept queue


def env_trust_uids() -> set[int]:
    """``$INFERA_KVD_TRUST_UID``: uids or user names, comma-separated (read at each connect)."""
    raw = os.environ.get(TRUST_ENV, "")
    uids: set[int] = set()
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        if item.isdigit():
            uids.add(int(item))
            continue
        import pwd

        try:
            uids.add(pwd.getpwnam(item).pw_uid)
        except KeyError:
            raise KvdClientError(
                f"{TRUST_ENV}: {item!r} is not a uid or a user name", hint=f"e.g. {TRUST_ENV}=0,1001"
            ) from None
    return uids


def connect(path: str, timeout: float | None) -> socket.socket:
    """Connect, retrying while the daemon's accept queue is full (EAGAIN) until ``timeout``.

    A Unix socket refuses a connect at once with EAGAIN when the listener's backlog is full,
    however long the timeout: a busy second (hundreds of engines starting together) or a daemon
    paused for a moment would fail them all. ECONNREFUSED means nobody listens: no retry."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:  # EAGAIN: the accept queue is full
            sock.close()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise KvdUnavailable(
                    f"kvd at {path} did not accept the connection in time (its accept queue stayed full)",
                    hint="the daemon is overloaded or stopped; `kvd stat --socket PATH` checks",
                ) from None
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, CONNECT_BACKOFF_MAX_S)
        except FileNotFoundError:
            sock.close()
            raise KvdUnavailable(
                f"no kvd daemon at {path} (socket file not found)",
                hint="start one with `kvd serve --socket PATH`, or set INFERA_KVD_SOCKET",
            ) from None
        except OSError as exc:
            sock.close()
            what = _not_a_socket(path)
            if what:
                raise KvdUnavailable(
                    f"{path} is not a kvd socket: it is {what}",
                    hint="give the daemon's --socket path (`kvd serve --socket PATH`, or INFERA_KVD_SOCKET)",
                ) from None
            raise KvdUnavailable(
                f"cannot connect to kvd at {path}: {exc.strerror or exc}",
                hint="is the daemon running? `kvd stat --socket PATH` checks",
            ) from None


def _not_a_socket(path: str) -> str | None:
    """What ``path`` is when it exists and is not a socket (``a regular file``), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a regular file" if stat.S_ISREG(mode) else "not a socket"


def check_peer(sock: socket.socket, path: str, trust_uids: Iterable[int] | None) -> None:
    """Refuse a listener run by an untrusted uid, before any byte is sent to it.

    Trusted: this process's own uid, root, ``trust_uids`` and ``$INFERA_KVD_TRUST_UID``. Anyone
    else could have put a fake daemon at a predictable path: it would receive every chunk this
    client stores and feed it bytes of its choosing."""
    _pid, uid, _gid = peer_cred(sock)
    if uid in (0, os.geteuid(), os.getuid()):
        return
    if trust_uids is not None and uid in set(trust_uids):
        return
    if uid in env_trust_uids():
        return
    raise KvdUntrusted(
        f"the process listening on {path} runs as uid {uid}, which this client does not trust",
        hint=f"if that uid runs your kvd daemon, set {TRUST_ENV}={uid} (or pass trust_uids); "
        "otherwise someone else put a socket there",
    )


SPIN_ENV = "INFERA_KVD_SPIN_US"
MAX_SPIN_US = 100_000  # the most a client polls for a reply before it blocks


def parse_spin_us(text: str | None) -> int:
    """``INFERA_KVD_SPIN_US``: microseconds a daemon connection polls for a reply (0: block at once)."""
    if text is None or not text.strip():
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(
            f"{SPIN_ENV}={text!r} is not a whole number of microseconds",
            hint=f"0 (the default) waits for replies without polling; at most {MAX_SPIN_US}",
        ) from None
    if not 0 <= value <= MAX_SPIN_US:
        raise UsageError(f"{SPIN_ENV} must be between 0 and {MAX_SPIN_US} microseconds (got {value})")
    return value


def default_spin() -> float:
    """Seconds a client polls for a reply before blocking: ``$INFERA_KVD_SPIN_US`` (default 0: off);
    a bad value is a UsageError naming the variable."""
    return parse_spin_us(os.environ.get(SPIN_ENV)) / 1e6


def error_of(reply: dict[str, Any], op: str = "the request") -> KvdClientError:
    """The exception for a reply with ``ok: false`` to ``op``, by its error code. A reply without a
    code (or with one that is not a string) is not one a kvd daemon sends: it says so, rather than
    pass for an internal error of the daemon."""
    code = reply.get("error")
    message = reply.get("message")
    if not isinstance(code, str) or not code:
        said = f": {message}" if isinstance(message, str) and message else ""
        return KvdProtocolError(
            f"the daemon refused {op} without an error code (a reply this client does not understand){said}",
            "unknown",
            hint="is the socket a kvd daemon of this version? `kvd doctor --socket PATH` checks",
        )
    if not isinstance(message, str) or not message:
        message = f"{op} failed: {code}"
    if code == "refused":
        return KvdRefused(message, hint="start the daemon with --allow-uid for this user")
    if code == "quota":
        return KvdQuota(
            message,
            hint="release leases, seal reservations or let holds end; or raise the daemon's --client-quota",
        )
    if code in ("full", "too_large"):
        return KvdFull(message, hint="raise the daemon's --max-bytes, or release leases")
    if code == "unsupported":
        return KvdUnsupported(message, code)
    return KvdProtocolError(message, code)
