"""Starting the daemon from validated flags (shared by ``kvd serve`` and ``python -m infera.kvd``)."""

from __future__ import annotations

import logging
import sys

from infera.kvd.config import DaemonConfig


def run_daemon(cfg: DaemonConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit status."""
    from infera.kvd.server import Server

    logging.basicConfig(
        level=getattr(logging, cfg.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    server = Server(cfg)
    try:
        server.start()
    except BaseException:
        server.shutdown()
        raise
    server.install_signal_handlers()
    server.serve_forever()
    return 0
