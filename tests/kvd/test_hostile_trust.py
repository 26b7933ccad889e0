"""The trust boundary: what a client, another local user or a fake daemon can do to the daemon
and its clients (a sealed arena, a vetted socket path, a verified listener, a full accept queue).

Tests that need a second local user run as root and use uid/gid 65534 (``nobody``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_daemon import FakeDaemon, hello_fds, refused_start
from hostile import HealthProbe, enough_rounds, raw

from helpers import Daemon
from infera.errors import KvdError
from infera.kvd import paths
from infera.kvd.client import (
    TRUST_ENV,
    KvdArenaError,
    KvdClient,
    KvdClientError,
    KvdProtocolError,
    KvdUnavailable,
    KvdUntrusted,
)
from infera.kvd.process import wait_until
from infera.kvd.protocol import default_socket_path

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second local user")
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 16)
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


# -- item 1: nobody can resize the arena -----------------------------------------------------
def test_a_client_cannot_resize_the_arena_and_the_disk_tier_keeps_working(
    start_daemon: Callable[..., Daemon], short_tmp: Path
) -> None:
    d = start_daemon("--max-bytes", "16M", "--long-path", str(short_tmp / "long"), "--long-bytes", "64M")
    with HealthProbe(d.socket) as probe, d.client(namespace="writer") as writer:
        hostile = raw(d.socket)
        reply, fds = hello_fds(hostile)
        assert reply["ok"] and len(fds) == 1
        fd, size = fds[0], reply["arena_size"]
        try:
            # checked first so that today's unsealed arena fails here, before any damage
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SIZE_SEALS == SIZE_SEALS
            for new_size in (0, size // 2, size - 4096, size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, new_size)
            with pytest.raises(PermissionError):  # F_SEAL_SEAL: no seal can be added either
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
            with pytest.raises(OSError):
                os.posix_fallocate(fd, 0, size + (1 << 20))
            assert os.fstat(fd).st_size == size
            # the hostile client's own mapping still works to the last byte
            with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                assert m[size - 1 : size] is not None
        finally:
            for f in fds:
                os.close(f)
            hostile.close()
        # the daemon reads the arena for write-through: it must still do so, bytes intact
        data = {b"long-%d" % i: os.urandom(256 << 10) for i in range(8)}
        for key, value in data.items():
            assert writer.put(key, value, retention="long")
        wait_until(
            lambda: (s := writer.stats()["tiers"]["long"])["queued_writes"] == 0 and s["chunks"] >= 8,
            15,
            "8 chunks written through",
        )
        assert {k: writer.get(k) for k in data} == data
        assert d.alive()
        enough_rounds(probe)
    probe.assert_healthy()


def test_the_client_refuses_an_unsealed_arena(short_tmp: Path) -> None:
    path = str(short_tmp / "fake.sock")
    with FakeDaemon(path, arena="unsealed") as fake:
        with pytest.raises(KvdArenaError, match="not sealed"):
            KvdClient(path, timeout=5)
        assert "PUT" not in fake.ops


def test_a_short_arena_is_the_clients_own_error(short_tmp: Path) -> None:
    path = str(short_tmp / "fake.sock")
    with FakeDaemon(path, arena="short"):
        with pytest.raises(KvdArenaError, match="fewer than the 1048576 announced"):
            KvdClient(path, timeout=5)
        with KvdClient(path, timeout=5, want_arena=False) as c:  # no arena: nothing to check
            assert c.ping()
    with FakeDaemon(path, arena="none"), pytest.raises(KvdProtocolError, match="did not pass the arena"):
        KvdClient(path, timeout=5)


# -- item 3: the socket path and the listener are vetted -------------------------------------
def start_over_a_planted_lock(short_tmp: Path, plant: Callable[[Path, str], None]) -> tuple[str, Path, Path]:
    """A daemon start after ``plant(victim, SOCKET.lock)`` linked the lock file's name to a file
    someone wants kept (``precious``): the refusal's stderr, the victim and the socket."""
    victim = short_tmp / "victim.txt"
    victim.write_text("precious\n")
    sock = short_tmp / "kvd.sock"
    plant(victim, str(sock) + ".lock")
    return refused_start(["--socket", str(sock), "--max-bytes", "8M"]), victim, sock


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(short_tmp: Path) -> None:
    err, victim, sock = start_over_a_planted_lock(short_tmp, os.symlink)
    assert "symbolic link" in err
    assert victim.read_text() == "precious\n"
    assert os.path.islink(str(sock) + ".lock") and not sock.exists()


@needs_root
def test_a_hard_linked_lock_file_is_refused(short_tmp: Path) -> None:
    err, victim, _sock = start_over_a_planted_lock(short_tmp, os.link)
    assert "hard links" in err and victim.read_text() == "precious\n"


@needs_root
def test_a_socket_dir_of_another_user_is_refused(short_tmp: Path) -> None:
    theirs = short_tmp / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    err = refused_start(["--socket", str(theirs / "kvd.sock"), "--max-bytes", "8M"])
    assert f"belongs to uid {NOBODY}" in err
    assert os.listdir(theirs) == []


@needs_root
def test_a_socket_dir_below_a_directory_of_another_user_is_refused(short_tmp: Path) -> None:
    theirs = short_tmp / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)  # they could rename our directory away and put theirs there
    err = refused_start(["--socket", str(theirs / "ours" / "kvd.sock"), "--max-bytes", "8M"])
    assert f"{theirs}, above the socket directory, belongs to uid {NOBODY}" in err
    assert os.listdir(theirs) == []  # nothing was created in it


def test_a_world_writable_socket_dir_needs_the_sticky_bit(short_tmp: Path) -> None:
    open_dir = short_tmp / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    err = refused_start(["--socket", str(open_dir / "kvd.sock"), "--max-bytes", "8M"])
    assert "without the sticky bit" in err and os.listdir(open_dir) == []
    os.chmod(open_dir, 0o1777)  # like /tmp: others cannot remove or rename our files
    d = Daemon(str(open_dir / "kvd.sock"), ["--max-bytes", "8M"], short_tmp / "sticky.log").start()
    try:
        with HealthProbe(d.socket) as probe:
            enough_rounds(probe)
        probe.assert_healthy()
    finally:
        d.stop()


@needs_root
def test_the_default_socket_dir_is_private_and_vetted(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INFERA_KVD_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert paths.is_default_dir(os.path.dirname(default_socket_path()))
    monkeypatch.setattr(paths, "DEFAULT_DIR_PREFIX", str(short_tmp / "infera-kvd-"))
    default_dir = short_tmp / f"infera-kvd-{os.getuid()}"
    sock = str(default_dir / "kvd.sock")
    assert paths.prepare_socket_dir(sock) == str(default_dir)
    assert stat.S_IMODE(os.stat(default_dir).st_mode) == 0o700
    os.chown(default_dir, NOBODY, NOBODY)  # another user got there first
    with pytest.raises(KvdError, match=f"belongs to uid {NOBODY}"):
        paths.prepare_socket_dir(sock)
    os.chown(default_dir, os.getuid(), os.getgid())
    os.chmod(default_dir, 0o777)
    with pytest.raises(KvdError, match="writable"):
        paths.prepare_socket_dir(sock)
    os.rmdir(default_dir)
    target = short_tmp / "elsewhere"
    target.mkdir(mode=0o700)
    os.symlink(target, default_dir)
    with pytest.raises(KvdError, match="symbolic link"):
        paths.prepare_socket_dir(sock)
    os.unlink(default_dir)
    assert paths.prepare_socket_dir(sock, shared=True) == str(default_dir)  # --allow-uid: reachable
    assert stat.S_IMODE(os.stat(default_dir).st_mode) == 0o711


def _evil_dir(short_tmp: Path) -> Path:
    os.chmod(short_tmp, 0o755)  # the fake, as nobody, must reach its own directory
    evil = short_tmp / "evil"
    evil.mkdir(mode=0o755)
    os.chown(evil, NOBODY, NOBODY)
    return evil


@needs_root
def test_the_client_refuses_a_fake_daemon_of_another_uid(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRUST_ENV, raising=False)
    path = str(_evil_dir(short_tmp) / "kvd.sock")
    with FakeDaemon(path, uid=NOBODY) as fake:
        with pytest.raises(KvdUntrusted, match=f"uid {NOBODY}") as info:
            KvdClient(path, namespace="root-secrets", timeout=5)
        assert TRUST_ENV in (info.value.hint or "")
        wait_until(lambda: any(e["event"] == "closed" for e in fake.events), 10, "the fake to see the close")
        assert fake.bytes_received == 0 and fake.ops == []  # not even the HELLO
        monkeypatch.setenv(TRUST_ENV, "no-such-user-here")
        with pytest.raises(KvdClientError, match=f"{TRUST_ENV}: 'no-such-user-here'"):
            KvdClient(path, timeout=5)

        # trusted on purpose: the environment variable, or the constructor argument
        monkeypatch.setenv(TRUST_ENV, f"4242,{NOBODY}")
        with KvdClient(path, timeout=5) as c:
            assert c.server_version == "fake"
            c.put(b"k", b"for the service user")
        monkeypatch.delenv(TRUST_ENV)
        with KvdClient(path, timeout=5, trust_uids=[NOBODY]) as c:
            assert c.ping()
        wait_until(lambda: "PUT" in fake.ops, 10, "the trusted PUT")
        assert fake.ops.count("HELLO") == 2


def test_own_uid_and_root_need_no_trust_configuration(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRUST_ENV, "no-such-user-here")
    with daemon.client() as c:  # our own daemon: the variable is not even read
        assert c.ping()


# -- item 4: only a stale socket is replaced --------------------------------------------------
def _regular(p: Path) -> Callable[[], bool]:
    p.write_text("not a socket\n")
    return lambda: p.read_text() == "not a socket\n"


def _directory(p: Path) -> Callable[[], bool]:
    p.mkdir()
    (p / "inside").write_text("x")
    return lambda: (p / "inside").read_text() == "x"


def _symlink(p: Path) -> Callable[[], bool]:
    target = p.with_name("target.txt")
    target.write_text("t")
    os.symlink(target, p)
    return lambda: p.is_symlink() and target.read_text() == "t"


def _foreign_socket(p: Path) -> Callable[[], bool]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.close()
    os.chown(p, NOBODY, NOBODY)
    return lambda: stat.S_ISSOCK(os.lstat(p).st_mode) and os.lstat(p).st_uid == NOBODY


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_regular, "is a regular file, not a kvd socket"),
        (_directory, "is a directory, not a kvd socket"),
        (_symlink, "is a symbolic link, not a kvd socket"),
        pytest.param(_foreign_socket, f"socket of uid {NOBODY}", marks=needs_root),
    ],
    ids=["regular-file", "directory", "symlink", "socket-of-another-uid"],
)
def test_only_a_stale_socket_is_replaced(
    short_tmp: Path, make: Callable[[Path], Callable[[], bool]], needle: str
) -> None:
    path = short_tmp / "kvd.sock"
    untouched = make(path)
    err = refused_start(["--socket", str(path), "--max-bytes", "8M"])
    first = next(ln for ln in err.splitlines() if ln.startswith("error: "))
    assert needle in first
    assert untouched()


# -- item 14: a full accept queue is waited out -----------------------------------------------
def test_a_paused_daemon_with_a_full_accept_queue_serves_every_client(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon("--max-bytes", "8M")
    n = 300
    ok: list[KvdClient] = []
    failed: list[str] = []
    lock = threading.Lock()

    def connect() -> None:
        try:
            c = KvdClient(d.socket, name="burst", timeout=10)
        except Exception as exc:
            with lock:
                failed.append(f"{type(exc).__name__}: {exc}")
        else:
            with lock:
                ok.append(c)

    threads = [threading.Thread(target=connect, daemon=True) for _ in range(n)]
    os.kill(d.pid, signal.SIGSTOP)
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)
    finally:
        os.kill(d.pid, signal.SIGCONT)
    for t in threads:
        t.join(15)
    try:
        assert not failed, f"{len(failed)} of {n} clients failed, e.g. {failed[:2]}"
        assert len(ok) == n
        with HealthProbe(d.socket) as probe:  # with all 300 still connected
            enough_rounds(probe)
        probe.assert_healthy()
        assert d.client().stats()["connections_total"] >= n
    finally:
        for c in ok:
            c.close()


def test_the_client_retries_while_the_accept_queue_is_full(short_tmp: Path) -> None:
    path = str(short_tmp / "fake.sock")
    with FakeDaemon(path, backlog=0, hold_accept=True) as fake:
        fillers: list[socket.socket] = []
        try:
            for _ in range(64):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(path)
                except BlockingIOError:
                    s.close()
                    break
                fillers.append(s)
            assert 1 <= len(fillers) < 64, "the accept queue never filled"
            t0 = time.monotonic()
            with pytest.raises(KvdUnavailable, match="did not accept the connection in time"):
                KvdClient(path, timeout=0.3)
            assert time.monotonic() - t0 >= 0.25  # it waited out its timeout, no more
            result: list[Any] = []

            def connect() -> None:
                try:
                    result.append(KvdClient(path, timeout=15))
                except Exception as exc:
                    result.append(exc)

            t = threading.Thread(target=connect, daemon=True)
            t.start()
            time.sleep(0.3)
            fake.release_accept()
            t.join(20)
            assert len(result) == 1 and isinstance(result[0], KvdClient), result
            result[0].close()
        finally:
            for s in fillers:
                s.close()
    # nobody listening is not worth waiting for
    stale = str(short_tmp / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    t0 = time.monotonic()
    with pytest.raises(KvdUnavailable, match="cannot connect"):
        KvdClient(stale, timeout=10)
    assert time.monotonic() - t0 < 2
