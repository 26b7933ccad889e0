"""The watcher thread of a :class:`~infera.engine.vllm.link.DaemonLink`: it sleeps in ``poll()`` on
a duplicate of the connection's descriptor and wakes the link when the daemon hangs up, or when a
retry is due while disconnected."""

from __future__ import annotations

import logging
import os
import select
import socket
import weakref
from typing import Protocol

from infera.kvd.client import KvdClient

log = logging.getLogger("infera.engine.vllm")
_HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLNVAL


class Watched(Protocol):
    """What the watcher asks of its link."""

    wakeups: int

    def _watch_state(self) -> tuple[KvdClient | None, float | None] | None: ...

    def _hung_up(self, client: KvdClient) -> None: ...

    def _retry(self) -> None: ...


def _dup(client: KvdClient) -> int:
    """A descriptor of ``client``'s connection for poll() (-1 if it has none we can see).

    A duplicate, so that the watcher never polls a number the client closed and the process
    reused; the link wakes the watcher whenever it drops the client, and the duplicate goes."""
    sock = getattr(client, "_sock", None)
    try:
        return os.dup(sock.fileno()) if sock is not None else -1
    except (OSError, ValueError):
        return -1


def watch(ref: weakref.ref[Watched], wake: socket.socket) -> None:
    """The watcher thread. Holds the link only weakly between wake-ups, so a link dropped
    without close() ends it too (its end of the wake-up pair closes)."""
    watched: KvdClient | None = None
    fd = -1
    try:
        while True:
            link = ref()
            state = link._watch_state() if link is not None else None
            if state is None:
                return
            client, due = state
            del link
            if client is not watched:
                if fd >= 0:
                    os.close(fd)
                watched, fd = client, (_dup(client) if client is not None else -1)
            del client
            poller = select.poll()
            poller.register(wake, select.POLLIN)
            if fd >= 0:
                poller.register(fd, 0)  # no events asked: poll reports only a hang-up or an error
            events = poller.poll(None if due is None else max(1, int(due * 1000)))
            hung = any(f == fd and ev & _HUNG_UP for f, ev in events)
            try:
                if wake.fileno() in (f for f, _ in events) and not wake.recv(4096):
                    return  # the link is gone
            except BlockingIOError:
                pass
            link = ref()
            if link is None:
                return
            link.wakeups += 1
            if hung and watched is not None:
                link._hung_up(watched)
            elif watched is None and due is not None:
                link._retry()
            del link
    except Exception:  # never let the thread die silently: the link then works as watch=False
        log.exception("infera-kvd: the daemon connection watcher stopped")
    finally:
        if fd >= 0:
            os.close(fd)
        wake.close()
