"""Leftover kvd sockets and lock files, and a running daemon whose socket is gone.

Where the daemon puts them: ``--socket`` (default ``$INFERA_KVD_SOCKET``, else
``$XDG_RUNTIME_DIR/infera-kvd.sock``, else ``/tmp/infera-kvd-<uid>/kvd.sock``) and ``<socket>.lock``
next to it, holding the daemon's pid. A daemon killed with SIGKILL leaves both. The next daemon of
the same uid replaces a stale socket and reuses the lock file by itself; anything else at the
socket path (a regular file, a directory, another uid's socket) makes it refuse to start. A
daemon still running whose socket was removed (``systemd-tmpfiles`` cleaning ``/tmp``, an ``rm``)
serves nobody: engines cannot connect until it is restarted.
"""

from __future__ import annotations

import contextlib
import os
import socket as socketlib
import stat
from dataclasses import dataclass

from infera.doctor.context import Context
from infera.doctor.facts.kvdconf import parse_flag_words
from infera.doctor.facts.procs import cmdline, kvd_daemons, kvd_flags
from infera.doctor.model import CheckResult, Evidence, Status, worst
from infera.doctor.registry import check


@dataclass
class Finding:
    status: Status
    text: str
    fix: str | None = None


def candidate_sockets(ctx: Context) -> dict[str, str]:
    """Socket paths to look at, and why each one."""
    out: dict[str, str] = {}
    if ctx.options.socket:
        out[ctx.options.socket] = "--socket"
    env = ctx.environ
    if env.get("INFERA_KVD_SOCKET"):
        out.setdefault(env["INFERA_KVD_SOCKET"], "$INFERA_KVD_SOCKET")
    if env.get("XDG_RUNTIME_DIR"):
        out.setdefault(
            os.path.join(env["XDG_RUNTIME_DIR"], "infera-kvd.sock"), "the default under $XDG_RUNTIME_DIR"
        )
    for p in kvd_daemons(ctx):
        sock = parse_flag_words(p.flags).values.get("socket")
        if sock:
            out.setdefault(str(sock), f"--socket of kvd daemon pid {p.pid}")
    h = ctx.host
    for name in h.listdir("/tmp"):
        if name.startswith("infera-kvd-") and name[len("infera-kvd-") :].isdigit():
            out.setdefault(f"/tmp/{name}/kvd.sock", "the per-user default")
    for uid in h.listdir("/run/user"):
        path = f"/run/user/{uid}/infera-kvd.sock"
        if h.exists(path) or h.exists(path + ".lock"):
            out.setdefault(path, "the default under $XDG_RUNTIME_DIR")
    return out


def _lock_holder(ctx: Context, lock: str) -> tuple[int | None, bool]:
    """(pid written in the lock file, whether that pid is a running kvd daemon)."""
    text = ctx.host.value(lock)
    if not text or not text.isdigit():
        return None, False
    pid = int(text)
    argv = cmdline(ctx, pid)
    return pid, bool(argv and kvd_flags(argv) is not None)


def _answers(path: str) -> bool | None:
    """Whether something accepts connections on the socket (None: cannot tell)."""
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except (BlockingIOError, TimeoutError):
        return True
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            s.close()


def _look(ctx: Context, path: str, why: str, ev: list[Evidence]) -> list[Finding]:
    h = ctx.host
    lock = path + ".lock"
    real = h.path(path)
    try:
        st: os.stat_result | None = os.lstat(real)
    except OSError:
        st = None
    has_lock = h.exists(lock)
    holder, holder_alive = _lock_holder(ctx, lock) if has_lock else (None, False)
    if st is None and not has_lock:
        return []
    kind = (
        "missing"
        if st is None
        else "socket"
        if stat.S_ISSOCK(st.st_mode)
        else (
            "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a regular file"
            if stat.S_ISREG(st.st_mode)
            else "a special file"
        )
    )
    lock_text = (
        ""
        if not has_lock
        else f"; lock file pid {holder if holder else '?'} ({'a running kvd daemon' if holder_alive else 'not running'})"
    )
    ev.append(Evidence(h.display(path), f"{kind} ({why}){lock_text}"))
    out: list[Finding] = []
    if st is not None and kind != "socket":
        out.append(
            Finding(
                Status.FAIL,
                f"{path} is {kind}, not a socket: a daemon given this socket refuses to start",
                f"remove {path} if nothing needs it, or give the daemon another --socket",
            )
        )
    elif kind == "socket":
        assert st is not None
        listening = (
            _answers(str(real))
            if ctx.live
            else (True if holder_alive else False if has_lock or holder else None)
        )
        if listening is False:
            other = ctx.live and st.st_uid != os.geteuid()
            out.append(
                Finding(
                    Status.WARN,
                    f"stale socket {path}: nothing listens on it"
                    + (
                        f" (it belongs to uid {st.st_uid}: another uid's daemon will not replace it)"
                        if other
                        else ""
                    ),
                    f"rm {path}"
                    + (f" {lock}" if has_lock else "")
                    + " (or start the daemon: it replaces its own stale socket)",
                )
            )
    elif holder_alive:
        out.append(
            Finding(
                Status.WARN,
                f"kvd daemon pid {holder} holds {lock} but its socket {path} is gone: engines cannot connect",
                f"restart the daemon (pid {holder}); keep its socket out of directories that are cleaned (systemd-tmpfiles)",
            )
        )
    if has_lock and not holder_alive and kind in ("missing", "socket") and not out:
        out.append(
            Finding(
                Status.WARN,
                f"leftover lock file {lock} (pid {holder or '?'} is not running)",
                f"rm {lock} (harmless: the next daemon reuses it)",
            )
        )
    return out


@check("leftovers", "leftover kvd sockets and lock files", "daemon", order=20)
def leftovers(ctx: Context) -> CheckResult:
    ev: list[Evidence] = []
    findings: list[Finding] = []
    paths = candidate_sockets(ctx)
    for path, why in paths.items():
        findings += _look(ctx, path, why, ev)
    looked = len(ev)
    if not ctx.live and any(e.value.startswith("socket") for e in ev):
        ev.append(
            Evidence("note", "sockets under --root are judged by their lock file, not connected to", "note")
        )
    status = worst((f.status for f in findings), Status.OK)
    if not findings:
        if not looked:
            return CheckResult(Status.OK, "no kvd sockets or lock files at the default paths", ev)
        return CheckResult(Status.OK, f"no leftover sockets or lock files ({looked} in use)", ev)
    return CheckResult(
        status,
        "; ".join(f.text for f in findings),
        ev,
        fix="; ".join(dict.fromkeys(f.fix for f in findings if f.fix)) or None,
    )
