"""Checks on the socket path before the daemon binds it.

The daemon often runs as root and its default socket lives at a predictable path under /tmp, so
nothing on the way to the socket is trusted blindly:

* the **socket directory** must not be controllable by another user. The per-user default
  (``/tmp/infera-kvd-<uid>/``) is created with mode 0700 and refused if it already exists owned by
  anyone else, as a symlink, or group/world-writable. Any other directory must be owned by this
  uid or root, and not group/world-writable unless it has the sticky bit (``/tmp`` itself).
* the **lock file** ``<socket>.lock`` is opened with ``O_NOFOLLOW`` and must be a regular file of
  this uid with one link: a symlink or hard link planted there would otherwise have the daemon
  truncate the file it points to and write its pid into it.
* only a **stale socket** (a socket file of this uid on which nothing answers) is replaced.
  A regular file, a directory or anything else at the socket path is left alone and reported.

Every refusal is a one-line :class:`KvdError` with a hint.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat

from infera.errors import KvdError

log = logging.getLogger("infera.kvd")

DEFAULT_DIR_PREFIX = "/tmp/infera-kvd-"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or special file"


def is_default_dir(parent: str) -> bool:
    """Whether ``parent`` is the per-user default socket directory of this uid."""
    return parent == f"{DEFAULT_DIR_PREFIX}{os.getuid()}"


def prepare_socket_dir(path: str, shared: bool = False) -> str:
    """Create (if needed) and vet the directory of the socket ``path``; returns it.

    Every directory on the way (as given, and with symlinks resolved) must be one another user
    cannot rename or replace entries in: owned by this uid or root, and not group/world-writable
    unless sticky. ``shared``: other uids are served (``--allow-uid``), so a default directory
    created here gets mode 0711 (others may reach the socket, never list it) instead of 0700."""
    parent = os.path.dirname(os.path.abspath(path))
    euid = os.geteuid()
    if is_default_dir(parent):
        _vet_chain(os.path.dirname(parent), euid, parent)
        mode = 0o711 if shared else 0o700
        try:
            os.mkdir(parent, mode)
            os.chmod(parent, mode)  # exact mode, whatever the umask
        except FileExistsError:
            pass
        except OSError as exc:
            raise KvdError(f"cannot create the socket directory {parent}: {exc.strerror}") from None
        _vet_default(parent, euid)
        return parent
    _vet_chain(parent, euid, parent, missing_ok=True)  # before creating anything in it
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise KvdError(f"cannot create the socket directory {parent}: {exc.strerror}") from None
    _vet_chain(parent, euid, parent)
    return parent


def _vet_default(parent: str, euid: int) -> None:
    """The per-user default directory: a real directory of this uid, private to it."""
    st = _lstat(parent)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise KvdError(
            f"socket directory {parent} is {_kind(st.st_mode)}, not a directory of uid {euid}",
            hint="someone else created it: remove it, or give --socket a path in a directory you own",
        )
    if st.st_uid != euid:
        raise KvdError(
            f"socket directory {parent} belongs to uid {st.st_uid}, not to this daemon's uid {euid}",
            hint="another user created it to intercept the socket: remove it, or give --socket "
            "a path in a directory you own",
        )
    if st.st_mode & 0o022:
        raise KvdError(
            f"socket directory {parent} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"chmod 0700 {parent}, or remove it and let the daemon create it",
        )


def _prefixes(path: str) -> list[str]:
    out = ["/"]
    for part in path.strip("/").split("/"):
        if part:
            out.append(os.path.join(out[-1], part))
    return out


def _vet_chain(top: str, euid: int, parent: str, missing_ok: bool = False) -> None:
    """Vet ``top`` and every directory above it, first as written, then with symlinks resolved."""
    seen: set[str] = set()
    for chain in (_prefixes(top), _prefixes(os.path.realpath(top))):
        for d in chain:
            if d in seen:
                continue
            seen.add(d)
            if missing_ok and not os.path.lexists(d):
                break  # makedirs creates the rest, as this uid
            _vet_dir(d, euid, "socket directory" if d == parent else f"{d}, above the socket directory,")


def _vet_dir(d: str, euid: int, what: str) -> None:
    name = what if what != "socket directory" else f"socket directory {d}"
    link = _lstat(d)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (euid, 0):
        raise KvdError(
            f"{name} is a symbolic link owned by uid {link.st_uid}",
            hint="its owner could point it elsewhere: give --socket a path owned by you or root",
        )
    try:
        st = os.stat(d)
    except OSError as exc:
        raise KvdError(f"cannot stat {d}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise KvdError(f"{name} is {_kind(st.st_mode)}, not a directory")
    if st.st_uid not in (euid, 0):
        raise KvdError(
            f"{name} belongs to uid {st.st_uid}, not to this daemon's uid {euid} or root",
            hint="its owner could replace the socket: give --socket a path in directories owned by you or root",
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise KvdError(
            f"{name} is group- or world-writable without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})",
            hint="anyone who can write there could replace the socket: use directories only you can write",
        )


def _lstat(d: str) -> os.stat_result:
    try:
        return os.lstat(d)
    except OSError as exc:
        raise KvdError(f"cannot stat {d}: {exc.strerror}") from None


def acquire_lock(lock_path: str, socket_path: str) -> int:
    """Open ``lock_path`` safely, take its exclusive flock and write our pid; returns the fd."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(lock_path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KvdError(
                f"{lock_path} is a symbolic link; refusing to follow it",
                hint="someone planted it: remove it, or give --socket a path in a directory only you can write",
            ) from None
        raise KvdError(f"cannot open {lock_path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        euid = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise KvdError(f"{lock_path} is {_kind(st.st_mode)}, not a lock file", hint="remove it")
        if st.st_uid != euid or st.st_nlink != 1:
            why = f"belongs to uid {st.st_uid}" if st.st_uid != euid else f"has {st.st_nlink} hard links"
            raise KvdError(
                f"{lock_path} {why}; refusing to use it as this daemon's lock file",
                hint="remove it, or give --socket a path in a directory only you can write",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            raise KvdError(
                f"another kvd daemon is already serving {socket_path}"
                + (f" (pid {holder})" if holder else ""),
                hint="stop it first, or give this one a different --socket",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def clear_stale_socket(path: str) -> None:
    """Remove a stale socket file at ``path`` (we hold the lock); refuse anything else there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise KvdError(f"cannot stat {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise KvdError(
            f"{path} exists and is {_kind(st.st_mode)}, not a kvd socket; leaving it alone",
            hint="remove it yourself if nothing needs it, or give --socket another path",
        )
    if st.st_uid != os.geteuid():
        raise KvdError(
            f"{path} is a socket of uid {st.st_uid}, not of this daemon; leaving it alone",
            hint="remove it yourself if nothing needs it, or give --socket another path",
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except ConnectionRefusedError:
        log.info("replacing stale socket file %s", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except FileNotFoundError:
        return
    except BlockingIOError:  # EAGAIN: a listener with a full accept queue is still a listener
        pass
    except OSError as exc:
        raise KvdError(f"cannot tell whether something listens on {path}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise KvdError(f"something is already listening on {path}", hint="give this daemon a different --socket")


__all__ = ["acquire_lock", "clear_stale_socket", "is_default_dir", "prepare_socket_dir"]
