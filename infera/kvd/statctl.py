"""``python -m infera.kvd.statctl --socket S`` / ``kvd stat``: print a daemon's counters.

Text output leads with the four counters the product doc tells users to check
(``sets_total``, ``gets_total``, ``hits_total``, ``misses_total``), then the clients and, per
namespace, what its engines declared of their KV layout (parallel sizes, KV cache groups and
what each chunk stores of them) and why engines of one model do not share chunks; ``--json`` prints one JSON
object whose keys are the counter names; ``--watch N`` repeats every N seconds. An unreachable
socket is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from infera import kvlayout, loadreport
from infera.units import format_size

MAIN = ("sets_total", "gets_total", "hits_total", "misses_total", "evictions_total")
MORE = (
    "bytes_in_total",
    "bytes_out_total",
    "chunks",
    "arena_bytes_used",
    "arena_bytes_capacity",
    "lookups_total",
    "lookup_keys_total",
    "lookup_hit_keys_total",
    "deletes_total",
    "put_rejected_total",
    "clients_connected",
)


def _reconcile_words(long: dict[str, Any]) -> str:
    """The disk tier's reconcile after a journal replay, if one ran: the index holds what the
    checkpoint and journal said; files they missed are added, gone ones dropped."""
    state = long.get("reconcile")
    if state == "running":
        return ", reconcile with the files running"
    if state in ("finished", "failed"):
        added, dropped = long.get("reconcile_added", 0), long.get("reconcile_dropped", 0)
        return f", reconcile {state} in {long.get('reconcile_s') or 0:.2f}s (+{added} -{dropped})"
    return ""


def fetch_stats(socket_path: str | None) -> dict[str, Any]:
    from infera.kvd.client import KvdClient

    with KvdClient(socket_path, name="kvd-stat", role="tool", want_arena=False, timeout=5.0) as client:
        return client.stats()


def render_text(stats: dict[str, Any], all_fields: bool = False) -> str:
    lines = []
    for key in MAIN:
        lines.append(f"{key:<24}{stats.get(key, 0)}")
    hits, gets = stats.get("hits_total", 0), stats.get("gets_total", 0)
    ratio = f"{hits / gets:.1%}" if gets else "n/a"
    lines.append(f"{'hit_ratio':<24}{ratio}")
    used, cap = stats.get("arena_bytes_used", 0), stats.get("arena_bytes_capacity", 0)
    lines.append(f"{'arena':<24}{format_size(used)} of {format_size(cap)} ({stats.get('chunks', 0)} chunks)")
    lines.append(
        f"{'bytes in / out':<24}{format_size(stats.get('bytes_in_total', 0))} / "
        f"{format_size(stats.get('bytes_out_total', 0))}"
    )
    long = stats.get("tiers", {}).get("long")
    if long:
        lines.append(
            f"{'long tier':<24}{long.get('backend', '?')} {long.get('state', '')}: "
            f"{long.get('chunks', 0)} chunks, {format_size(long.get('bytes_used', 0))}"
            + (f" of {format_size(long['capacity'])}" if long.get("capacity") else "")
            + f", hits {long.get('hits', 0)}, corrupt {long.get('corrupt_chunks', 0)}"
        )
        if "connected" in long:  # a distributed (L4) tier: where it is, how fast, what failed
            latency = long.get("latency_ms")
            lines.append(
                f"{'long tier link':<24}{long.get('endpoint', '?')} "
                f"{'connected' if long.get('connected') else 'NOT connected'}"
                + (f", latency {latency:.1f} ms" if isinstance(latency, int | float) else "")
                + f", errors {long.get('errors', 0)}, failed writes {long.get('failed_writes', 0)}"
                + f", dropped writes {long.get('dropped_writes', 0)}"
            )
        if long.get("backend") == "disk":  # L3: where, what moved, what went wrong
            load = long.get("index_load_s")
            lines.append(
                f"{'long tier disk':<24}{long.get('path', '?')}: misses {long.get('misses', 0)}, "
                f"read {format_size(long.get('bytes_read', 0))}, "
                f"written {format_size(long.get('bytes_written', 0))}, "
                f"queued {long.get('queued_writes', 0)}, failed {long.get('failed_writes', 0)}, "
                f"dropped {long.get('dropped_writes', 0)}"
                + (
                    f", index loaded in {load:.2f}s ({long.get('index_source') or '?'})"
                    if isinstance(load, int | float)
                    else ", index loading"
                )
                + _reconcile_words(long)
                + (
                    f", {long['files_other_version']} files of another format left alone"
                    if long.get("files_other_version")
                    else ""
                )
            )
        if long.get("last_error"):
            lines.append(f"{'long tier last error':<24}{long['last_error']}")
    if all_fields:
        skip = {*MAIN, "clients", "tiers", "warnings"}
        for key in sorted(k for k in stats if k not in skip):
            lines.append(f"{key:<24}{stats[key]}")
    clients = stats.get("clients", [])
    omitted = stats.get("clients_omitted", 0)
    lines.append(f"{'clients':<24}{len(clients)}" + (f" (and {omitted} more, not listed)" if omitted else ""))
    for c in clients:
        path = c.get("data_path", "arena")
        if c.get("fallback"):
            path += f" (FALLBACK: {c.get('fallback_reason', '?')})"
        lines.append(
            f"  pid {c.get('pid')} {c.get('name', '')} role={c.get('role', '')} "
            f"namespace={c.get('namespace') or '-'} path={path}"
        )
        policy = loadreport.summary(c.get("counters") or {})
        if policy:
            lines.append(f"    {policy}")
    lines += kvlayout.render(clients)  # per namespace: layout and KV cache groups, and why apart
    for w in stats.get("warnings", []):
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def run_stat(
    socket_path: str | None, *, json_out: bool = False, watch: float | None = None, all_fields: bool = False
) -> int:
    from infera.kvd.client import KvdClientError

    if watch is not None and watch <= 0:
        print("error: --watch needs a positive number of seconds", file=sys.stderr)
        return 2
    try:
        while True:
            try:
                stats = fetch_stats(socket_path)
            except KvdClientError as err:
                print(f"error: {err.message}", file=sys.stderr)
                return 1
            if json_out:
                print(json.dumps(stats, sort_keys=True), flush=True)
            else:
                if watch:
                    print(time.strftime("-- %H:%M:%S --"))
                print(render_text(stats, all_fields), flush=True)
            if not watch:
                return 0
            time.sleep(watch)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infera.kvd.statctl", description="Print kvd counters.")
    parser.add_argument("--socket", default=None, help="daemon socket (default: $INFERA_KVD_SOCKET)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS", help="repeat every SECONDS")
    parser.add_argument("--all", action="store_true", help="print every counter")
    args = parser.parse_args(argv)
    return run_stat(args.socket, json_out=args.json, watch=args.watch, all_fields=args.all)


if __name__ == "__main__":
    sys.exit(main())
