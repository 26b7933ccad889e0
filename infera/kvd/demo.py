"""``kvd demo``: the main job on an embedded default, for a first look.

It starts a daemon on a temporary socket, has one process write synthetic KV chunks through the
client and a second, separate process read them back and check every byte, then shows the
daemon's counters and cleans up. The chunk bytes are derived from the key, so the reader can
verify them without being told what the writer wrote.

Its sizes are checked before anything starts (:func:`demo_sizes`): the arena it asks for (twice the
chunks) must pass the daemon's own check against the host's RAM, which the caller passes in (this
tool does not import the daemon), and the disk tier's files must fit in the free space of /tmp. A
daemon that fails anyway is one ``error:`` line carrying what the daemon said, read from its log
before the temporary files go.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from infera.errors import KvdError, UsageError
from infera.kvd.process import DaemonProcess
from infera.units import format_size, parse_size


def chunk_key(i: int) -> bytes:
    return hashlib.blake2b(f"demo-prefix-{i}".encode(), digest_size=32).digest()


def chunk_bytes(i: int, size: int) -> bytes:
    """Deterministic pseudo-KV bytes for chunk ``i`` (a seeded stream, cheap to regenerate)."""
    seed = hashlib.sha256(f"demo-kv-{i}".encode()).digest()
    reps = size // len(seed) + 1
    block = bytearray(seed * reps)[:size]
    block[: min(8, size)] = i.to_bytes(8, "little")[: min(8, size)]
    return bytes(block)


def worker(role: str, sock: str, chunks: int, size: int) -> int:
    """Body of the writer / reader processes; prints one JSON line of results."""
    from infera.kvd.client import KvdClient

    t0 = time.perf_counter()
    out: dict[str, Any] = {"role": role, "pid": os.getpid()}
    with KvdClient(sock, namespace="demo-model", name=f"demo-{role}", role=role, model="demo-model") as c:
        if role == "writer":
            stored = 0
            for i in range(chunks):
                stored += c.put(chunk_key(i), chunk_bytes(i, size))
            out["stored"] = stored
        else:
            out["present_prefix"] = c.lookup([chunk_key(i) for i in range(chunks)])
            ok = bad = missing = 0
            buf = bytearray(size)
            for i in range(chunks):
                n = c.get_into(chunk_key(i), buf)
                if n is None:
                    missing += 1
                elif n == size and buf == chunk_bytes(i, size):
                    ok += 1
                else:
                    bad += 1
            out.update(verified=ok, corrupt=bad, missing=missing)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out), flush=True)
    return 0


def _run_worker(role: str, sock: str, chunks: int, size: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "infera.kvd.demo", role, sock, str(chunks), str(size)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        said = proc.stderr.strip().splitlines()
        raise KvdError(
            f"demo {role} process failed (status {proc.returncode}): {said[-1] if said else 'no output'}"
        )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _read_line(r: dict[str, Any], chunks: int) -> str:
    style = "green" if r["verified"] == chunks else "red"
    return (
        f"reader (pid {r['pid']}): LOOKUP found {r['present_prefix']}/{chunks} in order; "
        f"[{style}]{r['verified']} verified byte for byte[/], {r['corrupt']} corrupt, "
        f"{r['missing']} missing ({r['seconds']:.2f} s)"
    )


def demo_sizes(
    chunks: int, chunk_size: str, fits_host: Callable[[int], None] | None = None, tmp: str = "/tmp"
) -> tuple[int, int, int]:
    """``(chunk bytes, arena bytes, disk tier bytes)`` of a demo, checked (UsageError): positive
    counts and sizes, an arena ``fits_host`` accepts (the daemon's check against the host's RAM,
    :func:`infera.kvd.arena.check_fits_host`), and room in ``tmp`` for the chunk files."""
    if chunks < 1:
        raise UsageError(f"--chunks: {chunks} is not a positive number of chunks")
    size = parse_size(chunk_size, "--chunk-size")
    if size < 1:
        raise UsageError(f"--chunk-size: {chunk_size!r} is not a positive size", hint="e.g. 64K or 1M")
    arena = max(64 << 20, chunks * (size + 4096) * 2)
    arena = (arena + (1 << 20) - 1) >> 20 << 20
    disk = max(256 << 20, arena * 2)
    what = f"--chunks {chunks} of --chunk-size {chunk_size}"
    if fits_host is not None:
        try:
            fits_host(arena)
        except UsageError as err:  # it names --max-bytes, which the demo chose
            raise UsageError(
                f"{what} need a {format_size(arena)} arena (twice the chunks), and the daemon would "
                f"refuse it: {err.message}",
                hint="use fewer or smaller chunks",
            ) from None
    free = shutil.disk_usage(tmp).free
    files = chunks * (size + 4096)
    if files > free:
        raise UsageError(
            f"{what} would write {format_size(files)} of chunk files, more than the {format_size(free)} "
            f"free in {tmp}",
            hint="use fewer or smaller chunks",
        )
    return size, arena, disk


def _daemon_failed(daemon: DaemonProcess, err: KvdError) -> KvdError:
    """What the daemon said before it failed (its last ``error:`` line and hint, else its last log
    line), as one error: the log itself goes with the temporary files."""
    lines = [line.strip() for line in daemon.log().splitlines() if line.strip()]
    said = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("error: ")), None)
    status = daemon.returncode
    if "did not answer" in err.message:  # (wait_ready killed it)
        how = "did not answer in time"
    else:
        how = f"exited with status {status}" if status is not None else "did not come up"
    if said is not None:
        after = lines[said + 1] if said + 1 < len(lines) else ""
        hint = after.removeprefix("hint: ") if after.startswith("hint: ") else None
        return KvdError(f"the demo daemon {how}: {lines[said].removeprefix('error: ')}", hint=hint)
    last = lines[-1] if lines else err.message.splitlines()[0]
    return KvdError(f"the demo daemon {how}; the last line of its log: {last}")


def run_demo(
    chunks: int, chunk_size: str, keep: bool = False, fits_host: Callable[[int], None] | None = None
) -> int:
    """The demo (see the module docstring); its exit status. ``fits_host``: the daemon's check of an
    arena against this host's RAM."""
    from rich.console import Console
    from rich.table import Table

    from infera.kvd.client import KvdClient

    console = Console()
    size, arena, disk = demo_sizes(chunks, chunk_size, fits_host)
    tmp = tempfile.mkdtemp(prefix="kvd-demo-", dir="/tmp")
    sock = os.path.join(tmp, "kvd.sock")
    long_path = os.path.join(tmp, "long")
    args = ["--max-bytes", f"{arena >> 20}M", "--long-path", long_path, "--long-bytes", f"{disk >> 20}M"]
    daemon = DaemonProcess(sock, args, os.path.join(tmp, "daemon.log"), label="the demo daemon")
    console.print(f"[bold]1.[/] starting a kvd daemon: [cyan]python {' '.join(daemon.argv[1:])}[/]")
    try:
        try:
            daemon.start(timeout=20)
        except KvdError as err:
            raise _daemon_failed(daemon, err) from None
        console.print(
            f"   daemon pid {daemon.pid} on {sock}: a {format_size(arena)} RAM arena and a "
            f"{format_size(disk)} disk tier in {long_path}"
        )
        with console.status(f"[bold]2.[/] writer process storing {chunks} chunks of {format_size(size)}..."):
            w = _run_worker("writer", sock, chunks, size)
        console.print(
            f"[bold]2.[/] writer (pid {w['pid']}) stored {w['stored']} chunks "
            f"({format_size(w['stored'] * size)}) in {w['seconds']:.2f} s"
        )
        with console.status("[bold]3.[/] a separate reader process fetching and verifying..."):
            r = _run_worker("reader", sock, chunks, size)
        console.print(f"[bold]3.[/] {_read_line(r, chunks)}")
        with console.status("[bold]4.[/] restarting the daemon (its RAM is gone; the disk tier stays)..."):
            try:
                daemon.restart(timeout=20, stop_timeout=30)
            except KvdError as err:
                raise _daemon_failed(daemon, err) from None
        console.print(f"[bold]4.[/] daemon restarted (pid {daemon.pid}): its RAM tier starts empty")
        with console.status("[bold]5.[/] a new reader process after the restart..."):
            r2 = _run_worker("reader", sock, chunks, size)
        console.print(f"[bold]5.[/] {_read_line(r2, chunks)}, served from disk")
        with KvdClient(sock, want_arena=False, name="kvd-demo", role="tool") as c:
            st = c.stats()
        long = st.get("tiers", {}).get("long", {})
        table = Table(title="6. counters after the restart (kvd stat)")
        table.add_column("counter")
        table.add_column("value", justify="right")
        for key in ("gets_total", "hits_total", "misses_total", "chunks"):
            table.add_row(key, str(st[key]))
        table.add_row("disk tier hits", str(long.get("hits", 0)))
        table.add_row(
            "disk tier files", f"{long.get('chunks', 0)} ({format_size(long.get('bytes_used', 0))})"
        )
        table.add_row("corrupt chunks", str(long.get("corrupt_chunks", 0)))
        console.print(table)
        ok = r["verified"] == chunks and r2["verified"] == chunks and st["misses_total"] == 0
        if ok:
            console.print(
                "[green]demo passed:[/] every chunk written by one process was read intact by another, "
                "and again from disk after a daemon restart."
            )
        else:
            console.print("[red]demo found a problem[/]: see the counters above.")
        if keep:
            console.print(f"daemon left running (pid {daemon.pid}); try: kvd stat --socket {sock}")
        return 0 if ok else 1
    finally:
        if not keep:
            daemon.stop(timeout=30)
            shutil.rmtree(tmp, ignore_errors=True)
            console.print("[bold]7.[/] daemon stopped and temporary files removed.")


if __name__ == "__main__":
    role, sock_arg, n_arg, size_arg = sys.argv[1:5]
    sys.exit(worker(role, sock_arg, int(n_arg), int(size_arg)))
