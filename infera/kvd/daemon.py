"""Starting the daemon from validated flags (shared by ``kvd serve`` and ``python -m infera.kvd``)."""

from __future__ import annotations

import ctypes
import logging
import platform
import sys

from infera.kvd.config import DaemonConfig

log = logging.getLogger("infera.kvd")

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20


def pin_mmap_threshold() -> bool:
    """Have glibc give every allocation of 1 MiB or more its own mapping, returned on free.

    glibc raises its mmap threshold each time a big block is freed (up to 32 MiB), after which
    big request buffers live on the heap: growing one copies it, and freed ones stay resident. The
    daemon's input and output budgets would then bound what it holds but not what it costs (a
    32 MiB input budget measured up to 65 MiB of peak memory). A fixed threshold keeps the two
    equal. Returns whether it was applied (False off glibc).
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def run_daemon(cfg: DaemonConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit status."""
    from infera.kvd.arena import check_fits_host
    from infera.kvd.server import Server

    check_fits_host(cfg.max_bytes)
    logging.basicConfig(
        level=getattr(logging, cfg.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not pin_mmap_threshold():
        log.debug("malloc's mmap threshold left as it is (not glibc)")
    server = Server(cfg)
    try:
        server.start()
    except BaseException:
        server.shutdown(started=False)  # the error is the one line the user sees
        raise
    server.install_signal_handlers()
    server.serve_forever()
    return 0
