"""The queue of replies the kernel has not taken yet, one per connection.

A reply is a frame plus, for HELLO, the arena descriptor, which must leave with the first byte of
its own frame (SCM_RIGHTS). The loop never blocks on a client: it appends here and sends what the
socket takes whenever the socket is writable (see infera.kvd.netout for the budgets around it).
"""

from __future__ import annotations

import socket
from collections import deque

_COMPACT_BYTES = 1 << 20  # a queue head this far into its buffer is compacted


class _Segment:
    """Bytes to send; ``fds`` go with the first of them (SCM_RIGHTS), then are forgotten."""

    __slots__ = ("buf", "fds", "off")

    def __init__(self, data: bytes | memoryview, fds: list[int] | None) -> None:
        self.buf = bytearray(data)
        self.fds = fds
        self.off = 0


class OutQueue:
    """A connection's replies not yet taken by the kernel, in order.

    A frame carrying descriptors starts a new segment, so its descriptors are sent with its first
    byte; frames without any are appended to the last segment and go out in as few sends as the
    socket allows.
    """

    __slots__ = ("segs", "size")

    def __init__(self) -> None:
        self.segs: deque[_Segment] = deque()
        self.size = 0

    def push(self, data: bytes | memoryview, fds: list[int] | None = None) -> None:
        if fds or not self.segs:
            self.segs.append(_Segment(data, fds))
        else:
            self.segs[-1].buf += data
        self.size += len(data)

    def flush(self, sock: socket.socket) -> None:
        """Send as much as the socket takes without blocking; raises OSError if it is broken."""
        segs = self.segs
        while segs:
            seg = segs[0]
            view = memoryview(seg.buf)[seg.off :]
            try:
                if seg.fds:
                    n = socket.send_fds(sock, [view], seg.fds)
                    seg.fds = None
                else:
                    n = sock.send(view)
            except (BlockingIOError, InterruptedError):
                return
            finally:
                view.release()  # the buffer may grow again only once no view of it is left
            self.size -= n
            seg.off += n
            if seg.off == len(seg.buf):
                segs.popleft()
                continue
            if seg.off >= _COMPACT_BYTES and seg.off * 2 >= len(seg.buf):
                del seg.buf[: seg.off]
                seg.off = 0
            return
