"""The shared-memory arena and its allocator.

The daemon owns one memfd of ``--max-bytes`` and hands its descriptor to every client at HELLO.
Regions are carved out of it by :class:`Allocator`, a best-fit allocator over free extents that
coalesces neighbours on free. Every region starts on a 4 KiB boundary, so a chunk in the arena
can be the target of an O_DIRECT read, and same-size chunks never fragment the arena: the hole a
freed chunk leaves is exactly the size of the next one.

The memfd's size is sealed (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``) before its descriptor
is handed out, so no client can resize it: every offset below the capacity stays backed for the
life of the arena, and no mapping of it (the daemon's, or another client's) can ever take SIGBUS.
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import gc
import logging
import mmap
import os
import threading
import time

from infera.errors import KvdError, UsageError
from infera.kvd.populate import MADV_POPULATE_WRITE
from infera.kvd.protocol import SIZE_SEALS
from infera.units import format_size

ALIGN = 4096
ARENA_SEALS = SIZE_SEALS | fcntl.F_SEAL_SEAL  # and no further seal (e.g. F_SEAL_FUTURE_WRITE) either
log = logging.getLogger("infera.kvd")


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class Allocator:
    """Best-fit allocator over ``[0, capacity)`` in ALIGN units.

    Free extents are kept twice: by offset (for coalescing) and by (size, offset) (for best fit).
    Both are sorted lists maintained with bisect; allocation and free are O(log n) searches plus
    a list insert, which stays cheap for the hundred-thousand-chunk scale the daemon targets.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity - capacity % ALIGN
        self._offs: list[int] = []
        self._size_at: dict[int, int] = {}
        self._by_size: list[tuple[int, int]] = []
        self.used = 0
        if self.capacity > 0:
            self._add_free(0, self.capacity)

    def _add_free(self, off: int, size: int) -> None:
        bisect.insort(self._offs, off)
        self._size_at[off] = size
        bisect.insort(self._by_size, (size, off))

    def _remove_free(self, off: int) -> int:
        size = self._size_at.pop(off)
        i = bisect.bisect_left(self._offs, off)
        del self._offs[i]
        j = bisect.bisect_left(self._by_size, (size, off))
        del self._by_size[j]
        return size

    def alloc(self, nbytes: int) -> int | None:
        """Return the offset of a fresh region of ``align_up(nbytes)`` bytes, or None if none fits."""
        size = align_up(max(nbytes, 1))
        i = bisect.bisect_left(self._by_size, (size, -1))
        if i == len(self._by_size):
            return None
        fsize, off = self._by_size[i]
        self._remove_free(off)
        if fsize > size:
            self._add_free(off + size, fsize - size)
        self.used += size
        return off

    def free(self, off: int, nbytes: int) -> None:
        """Return a region obtained from :meth:`alloc` with the same ``nbytes``."""
        size = align_up(max(nbytes, 1))
        self.used -= size
        i = bisect.bisect_left(self._offs, off)
        # merge with the following extent
        if i < len(self._offs) and self._offs[i] == off + size:
            size += self._remove_free(off + size)
        # merge with the preceding extent
        if i > 0:
            prev = self._offs[i - 1]
            psize = self._size_at[prev]
            if prev + psize == off:
                self._remove_free(prev)
                off, size = prev, psize + size
        self._add_free(off, size)

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    @property
    def extents(self) -> int:
        return len(self._offs)


class Arena:
    """A memfd of ``capacity`` bytes, mapped read-write in this process."""

    def __init__(self, capacity: int, name: str = "infera-kvd-arena") -> None:
        self.capacity = capacity - capacity % ALIGN
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.capacity)
            # Seal the size before the descriptor leaves this process: a client that could
            # ftruncate it would turn every other mapping's next access into SIGBUS (or, grown
            # back, into zeros served as valid chunks). F_SEAL_SEAL stops anyone adding seals later.
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, ARENA_SEALS)
        except BaseException:
            os.close(self.fd)
            raise
        self.map = mmap.mmap(self.fd, self.capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.map)
        self.closed = False
        self._prefault: threading.Thread | None = None

    def prefault_in_background(self, step: int = 64 << 20) -> threading.Thread:
        """Commit every page of the arena now, in a thread, so first writes do not pay page faults.

        Uses ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+) through ctypes, which releases the GIL;
        on older kernels it logs why and does nothing. The memory is committed up front: that is
        the point, and the cost, of ``--prefault``."""

        def _run() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
            t0 = time.monotonic()
            for off in range(0, self.capacity, step):
                if self.closed:
                    return
                n = min(step, self.capacity - off)
                if libc.madvise(ctypes.c_void_p(base + off), ctypes.c_size_t(n), MADV_POPULATE_WRITE) != 0:
                    err = ctypes.get_errno()
                    log.warning(
                        "--prefault: madvise failed (%s); pages fault in on first use", os.strerror(err)
                    )
                    return
            log.info("arena prefaulted: %d MiB in %.1f s", self.capacity >> 20, time.monotonic() - t0)

        thread = threading.Thread(target=_run, name="kvd-prefault", daemon=True)
        thread.start()
        self._prefault = thread
        return thread

    def close(self) -> None:
        self.closed = True
        if self._prefault is not None:
            self._prefault.join()
        self.view.release()
        try:
            self.map.close()
        except BufferError:
            # A view of the arena is still referenced: a failed disk write's buffer in an
            # exception's traceback, say (reference cycles). Collect them and try once more.
            gc.collect()
            try:
                self.map.close()
            except BufferError:
                log.warning("arena: a view of it is still held at close; the mapping goes with the process")
        os.close(self.fd)


def host_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """This host's RAM (``MemTotal``) in bytes, or None where it cannot be read."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits_host(capacity: int, meminfo: str = "/proc/meminfo") -> None:
    """Refuse an arena of more than the host's RAM before the daemon starts: it would map, then
    die (OOM killer, or SIGBUS on a full shmem) once engines had written that much."""
    total = host_memory(meminfo)
    if total is not None and capacity > total:
        raise UsageError(
            f"--max-bytes {format_size(capacity)} is more than this host's memory ({format_size(total)})",
            hint="give the arena part of the RAM; `kvd doctor --max-bytes SIZE` checks it against the host and its cgroup",
        )


def open_arena(capacity: int) -> Arena:
    """The daemon's arena of ``capacity`` bytes (``--max-bytes``); a mapping the kernel refuses
    (overcommit, ``ulimit -v``) is a one-line error, not a traceback."""
    try:
        return Arena(capacity)
    except OSError as exc:
        raise KvdError(
            f"--max-bytes {format_size(capacity)}: cannot map the arena: {exc.strerror or exc}",
            hint="check `ulimit -v` and vm.overcommit_memory, or give a smaller --max-bytes",
        ) from None
