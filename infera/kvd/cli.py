"""``kvd serve``, ``kvd stat`` and ``kvd demo``."""

from __future__ import annotations

import typer

SERVE_HELP = "Run the per-host kvd daemon (same flags as `python -m infera.kvd`)."


def serve(
    socket: str = typer.Option(
        None, "--socket", help="Unix socket path [default: $INFERA_KVD_SOCKET, else a per-user runtime path]"
    ),
    max_bytes: str = typer.Option("1G", "--max-bytes", help="RAM arena size (binary units: 512M, 16G, 1T)."),
    long_path: str = typer.Option(None, "--long-path", help="Directory of the disk long tier (L3)."),
    long_bytes: str = typer.Option(None, "--long-bytes", help="Capacity of the disk long tier, e.g. 256G."),
    long_backend: str = typer.Option(
        None, "--long-backend", help="Long tier backend: disk (with --long-path), mooncake or lmcache."
    ),
    socket_mode: str = typer.Option("0660", "--socket-mode", help="Permissions of the socket file (octal)."),
    allow_uid: list[str] = typer.Option(
        [],
        "--allow-uid",
        help="Also accept clients of this uid or user name (repeatable; '*' for anyone). "
        "The daemon's own uid is always accepted.",
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    metrics_port: int = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics on 127.0.0.1:PORT (off by default)."
    ),
    ephemeral_ttl: str = typer.Option("300s", "--ephemeral-ttl", help="Lifetime of `ephemeral` chunks."),
    fsync: str = typer.Option(
        "data", "--fsync", help="Disk tier durability: none, data (fdatasync each file) or always."
    ),
    mooncake_master: str = typer.Option(
        None,
        "--mooncake-master",
        envvar="INFERA_KVD_MOONCAKE_MASTER",
        help="Mooncake master RPC address HOST:PORT (or etcd://HOST:PORT for an HA master).",
    ),
    mooncake_metadata: str = typer.Option(
        None,
        "--mooncake-metadata",
        envvar="INFERA_KVD_MOONCAKE_METADATA",
        help="Mooncake metadata service: http://HOST:PORT/metadata, etcd://HOST:PORT or "
        "P2PHANDSHAKE (default: P2PHANDSHAKE).",
    ),
    mooncake_protocol: str = typer.Option(
        None, "--mooncake-protocol", envvar="INFERA_KVD_MOONCAKE_PROTOCOL", help="tcp or rdma (default: tcp)."
    ),
    mooncake_device: str = typer.Option(
        None, "--mooncake-device", envvar="INFERA_KVD_MOONCAKE_DEVICE", help="RDMA device names, e.g. mlx5_0."
    ),
    mooncake_segment_bytes: str = typer.Option(
        None,
        "--mooncake-segment-bytes",
        envvar="INFERA_KVD_MOONCAKE_SEGMENT_BYTES",
        help="Memory this daemon lends to the Mooncake pool (default: 0: the data lives on storage nodes).",
    ),
    mooncake_buffer_bytes: str = typer.Option(
        None,
        "--mooncake-buffer-bytes",
        envvar="INFERA_KVD_MOONCAKE_BUFFER_BYTES",
        help="Mooncake client transfer buffer (default: 16M).",
    ),
    lmcache_url: str = typer.Option(
        None, "--lmcache-url", envvar="INFERA_KVD_LMCACHE_URL", help="lmcache_server address lm://HOST:PORT."
    ),
    busy_poll_us: int = typer.Option(
        1000,
        "--busy-poll-us",
        help="After traffic, poll for this long before sleeping (lower latency, a little CPU; 0 = off).",
    ),
    prefault: bool = typer.Option(
        False,
        "--prefault",
        help="Commit the whole arena at start (in the background) so first writes pay no page faults.",
    ),
) -> None:
    """Run the per-host kvd daemon."""
    from infera.clikit import run_guarded
    from infera.errors import UsageError
    from infera.kvd.config import build_config
    from infera.kvd.daemon import run_daemon
    from infera.kvd.tiers import SUPPORTED

    def _go() -> int:
        cfg = build_config(
            socket=socket,
            max_bytes=max_bytes,
            long_path=long_path,
            long_bytes=long_bytes,
            long_backend=long_backend,
            socket_mode=socket_mode,
            allow_uid=allow_uid,
            log_level=log_level,
            metrics_port=metrics_port,
            ephemeral_ttl=ephemeral_ttl,
            fsync=fsync,
            supported_backends=SUPPORTED,
            mooncake_master=mooncake_master,
            mooncake_metadata=mooncake_metadata,
            mooncake_protocol=mooncake_protocol,
            mooncake_device=mooncake_device,
            mooncake_segment_bytes=mooncake_segment_bytes,
            mooncake_buffer_bytes=mooncake_buffer_bytes,
            lmcache_url=lmcache_url,
        )
        cfg.prefault = prefault
        if not 0 <= busy_poll_us <= 100_000:
            raise UsageError("--busy-poll-us must be between 0 and 100000")
        cfg.busy_poll_us = busy_poll_us
        return run_daemon(cfg)

    code = run_guarded(_go)
    raise typer.Exit(code or 0)


def stat(
    socket: str = typer.Option(None, "--socket", help="Daemon socket [default: $INFERA_KVD_SOCKET]."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    watch: float = typer.Option(None, "--watch", help="Print again every SECONDS until Ctrl-C."),
    all_fields: bool = typer.Option(False, "--all", help="Print every counter, not only the main ones."),
) -> None:
    """Print the daemon's counters."""
    from infera.kvd.statctl import run_stat

    raise typer.Exit(run_stat(socket, json_out=json_out, watch=watch, all_fields=all_fields))


def demo(
    chunks: int = typer.Option(64, "--chunks", help="How many synthetic KV chunks to write."),
    chunk_size: str = typer.Option("1M", "--chunk-size", help="Size of each chunk."),
    keep_socket: bool = typer.Option(False, "--keep", help="Leave the daemon running at the end."),
) -> None:
    """Start a daemon on a temporary socket, write and read synthetic KV chunks from a second
    process, and show what happened."""
    from infera.clikit import run_guarded
    from infera.kvd.demo import run_demo

    raise typer.Exit(run_guarded(run_demo, chunks=chunks, chunk_size=chunk_size, keep=keep_socket))


def register(app: typer.Typer) -> None:
    app.command("serve", help=SERVE_HELP)(serve)
    app.command("stat")(stat)
    app.command("demo")(demo)
