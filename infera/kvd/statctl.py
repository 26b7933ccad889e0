"""``python -m infera.kvd.statctl --socket S`` / ``kvd stat``: print a daemon's counters.

Text output leads with the four counters the product doc tells users to check
(``sets_total``, ``gets_total``, ``hits_total``, ``misses_total``), then the clients and, per
namespace, what its engines declared of their KV layout (parallel sizes, KV cache groups and
what each chunk stores of them) and why engines of one model do not share chunks. Names and values
are in two columns as wide as the longest name; with ``--all`` a map is printed one ``name.key``
line per entry and a list as JSON. Whatever a client declared reaches the terminal with its
control characters escaped, and a field of an unexpected type is shown as ``?``
(:mod:`infera.display`).

``--json`` prints one JSON object whose keys are the counter names; it is always valid JSON
(:func:`to_json`). ``--watch N`` repeats every N seconds (0.1 to 3600, as ``kvd top --interval``);
a daemon that cannot be reached is one line on stderr per attempt and the watch goes on, so a
daemon restart does not end it. Without ``--watch`` an unreachable socket is one line on stderr
and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from infera import kvlayout, loadreport
from infera.display import ABSENT, count, items, mapping, number, printable, size
from infera.errors import KvdError

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
NAME_WIDTH = 24  # the name column is at least this wide, else as wide as the longest name + 2


# -- JSON -----------------------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data. What JSON has no word for follows one convention: NaN and the
    infinities are ``null``, a byte string is its hex digits, a map key that is not a string is
    written as JSON (``1``, ``null``), and anything else is its ``str``. A daemon sends none of
    these; a fake or broken one must still not make ``kvd stat --json`` print what is not JSON."""
    if isinstance(value, str) or value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {_json_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray):
        return bytes(key).hex()
    return json.dumps(jsonable(key), sort_keys=True)


def to_json(stats: Mapping[str, Any]) -> str:
    """One line of JSON (keys sorted), whatever the reply held (see :func:`jsonable`)."""
    return json.dumps(jsonable(stats), sort_keys=True, allow_nan=False)


# -- text -----------------------------------------------------------------------------------------
def _num(value: Any) -> str:
    """A counter as printed: the number, or ``?`` for a field of another type."""
    n = number(value)
    return str(n) if n is not None else ABSENT


def _text(value: Any, default: str = ABSENT) -> str:
    """A field that should be a string or a number, as printed (``default`` for anything else)."""
    if isinstance(value, str):
        return value
    return _num(value) if number(value) is not None else default


def _scalar(value: Any) -> str:
    """A value of ``--all``: a string as it is, anything else as JSON (``null``, ``true``, ``[...]``)."""
    return value if isinstance(value, str) else json.dumps(jsonable(value), sort_keys=True)


def _reconcile_words(long: Mapping[str, Any]) -> str:
    """The disk tier's reconcile after a journal replay, if one ran: the index holds what the
    checkpoint and journal said; files they missed are added, gone ones dropped."""
    state = long.get("reconcile")
    if state == "running":
        return ", reconcile with the files running"
    if state in ("finished", "failed"):
        added, dropped = _num(long.get("reconcile_added", 0)), _num(long.get("reconcile_dropped", 0))
        took = number(long.get("reconcile_s")) or 0
        return f", reconcile {state} in {took:.2f}s (+{added} -{dropped})"
    return ""


def _long_rows(long: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The long tier's lines: what it holds, its link (L4), its files (L3), its last error."""
    capacity = long.get("capacity")
    rows = [
        (
            "long tier",
            f"{_text(long.get('backend'))} {_text(long.get('state'), '')}: "
            f"{_num(long.get('chunks', 0))} chunks, {size(long.get('bytes_used', 0))}"
            + (f" of {size(capacity)}" if capacity else "")
            + f", hits {_num(long.get('hits', 0))}, corrupt {_num(long.get('corrupt_chunks', 0))}",
        )
    ]
    if "connected" in long:  # a distributed (L4) tier: where it is, how fast, what failed
        latency = number(long.get("latency_ms"))
        rows.append(
            (
                "long tier link",
                f"{_text(long.get('endpoint'))} {'connected' if long.get('connected') else 'NOT connected'}"
                + (f", latency {latency:.1f} ms" if latency is not None else "")
                + f", errors {_num(long.get('errors', 0))}, failed writes {_num(long.get('failed_writes', 0))}"
                + f", dropped writes {_num(long.get('dropped_writes', 0))}",
            )
        )
    if long.get("backend") == "disk":  # L3: where, what moved, what went wrong
        load = number(long.get("index_load_s"))
        other = long.get("files_other_version")
        rows.append(
            (
                "long tier disk",
                f"{_text(long.get('path'))}: misses {_num(long.get('misses', 0))}, "
                f"read {size(long.get('bytes_read', 0))}, "
                f"written {size(long.get('bytes_written', 0))}, "
                f"queued {_num(long.get('queued_writes', 0))}, failed {_num(long.get('failed_writes', 0))}, "
                f"dropped {_num(long.get('dropped_writes', 0))}"
                + (
                    f", index loaded in {load:.2f}s ({_text(long.get('index_source'), '') or ABSENT})"
                    if load is not None
                    else ", index loading"
                )
                + _reconcile_words(long)
                + (f", {_num(other)} files of another format left alone" if other else ""),
            )
        )
    if long.get("last_error"):
        rows.append(("long tier last error", _text(long["last_error"])))
    return rows


def _all_rows(stats: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every other top-level field: a map one ``name.key`` row per entry, the rest as one row."""
    skip = {*MAIN, "clients", "tiers", "warnings"}
    rows: list[tuple[str, str]] = []
    for key in sorted(stats, key=str):
        if key in skip:
            continue
        value = stats[key]
        if isinstance(value, Mapping) and value:
            rows += [(f"{key}.{sub}", _scalar(value[sub])) for sub in sorted(value, key=str)]
        else:
            rows.append((str(key), _scalar(value)))
    return rows


def _client_lines(clients: list[Mapping[str, Any]]) -> list[str]:
    lines = []
    for c in clients:
        path = _text(c.get("data_path", "arena"))
        if c.get("fallback"):
            path += f" (FALLBACK: {_text(c.get('fallback_reason'))})"
        lines.append(
            f"  pid {_text(c.get('pid'))} {_text(c.get('name', ''), '')} role={_text(c.get('role', ''), '')} "
            f"namespace={_text(c.get('namespace'), '') or '-'} path={path}"
        )
        policy = loadreport.summary(mapping(c.get("counters")))
        if policy:
            lines.append(f"    {policy}")
    return lines


def render_text(stats: Mapping[str, Any], all_fields: bool = False) -> str:
    """The text of ``kvd stat``: never an exception, whatever ``stats`` holds, and no control
    character of a client's reaches the terminal (escaped, :func:`infera.display.printable`)."""
    rows = [(key, _num(stats.get(key, 0))) for key in MAIN]
    hits, gets = number(stats.get("hits_total", 0)), number(stats.get("gets_total", 0))
    ratio = ABSENT if hits is None or gets is None else f"{hits / gets:.1%}" if gets else "n/a"
    rows.append(("hit_ratio", ratio))
    used, cap = stats.get("arena_bytes_used", 0), stats.get("arena_bytes_capacity", 0)
    rows.append(("arena", f"{size(used)} of {size(cap)} ({_num(stats.get('chunks', 0))} chunks)"))
    rows.append(
        (
            "bytes in / out",
            f"{size(stats.get('bytes_in_total', 0))} / {size(stats.get('bytes_out_total', 0))}",
        )
    )
    long = mapping(mapping(stats.get("tiers")).get("long"))
    if long:
        rows += _long_rows(long)
    if all_fields:
        rows += _all_rows(stats)
    clients = [c for c in items(stats.get("clients")) if isinstance(c, Mapping)]
    omitted = count(stats.get("clients_omitted"))
    rows.append(("clients", f"{len(clients)}" + (f" (and {omitted} more, not listed)" if omitted else "")))
    width = max(NAME_WIDTH, *(len(name) + 2 for name, _ in rows))
    lines = [f"{name:<{width}}{value}" for name, value in rows]
    lines += _client_lines(clients)
    lines += kvlayout.render(clients)  # per namespace: layout and KV cache groups, and why apart
    lines += [f"warning: {_text(w)}" for w in items(stats.get("warnings"))]
    return "\n".join(printable(line) for line in lines)


# -- the command ----------------------------------------------------------------------------------
def fetch_stats(socket_path: str | None) -> dict[str, Any]:
    from infera.kvd.client import KvdClient

    with KvdClient(socket_path, name="kvd-stat", role="tool", want_arena=False, timeout=5.0) as client:
        return client.stats()


def run_stat(
    socket_path: str | None, *, json_out: bool = False, watch: float | None = None, all_fields: bool = False
) -> int:
    """Print the counters once, or every ``watch`` seconds until Ctrl-C. Returns the exit status;
    a bad ``watch`` is a UsageError."""
    from infera.kvd.client import KvdClientError
    from infera.units import refresh_interval

    if watch is not None:
        watch = refresh_interval(watch, "--watch")
    hinted = False
    try:
        while True:
            try:
                stats = fetch_stats(socket_path)
            except KvdClientError as err:
                if not watch:
                    raise
                # one line per failed attempt; the watch goes on (a daemon restart must not end it)
                print(
                    f"error: {printable(err.message)} ({time.strftime('%H:%M:%S')}; trying again every {watch:g}s)",
                    file=sys.stderr,
                    flush=True,
                )
                if err.hint and not hinted:
                    print(f"hint: {printable(err.hint)}", file=sys.stderr, flush=True)
                    hinted = True
            else:
                if json_out:
                    print(to_json(stats), flush=True)
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
    from infera.clikit import report

    parser = argparse.ArgumentParser(prog="python -m infera.kvd.statctl", description="Print kvd counters.")
    parser.add_argument("--socket", default=None, help="daemon socket (default: $INFERA_KVD_SOCKET)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--watch", type=float, default=None, metavar="SECONDS", help="repeat every SECONDS (0.1 to 3600)"
    )
    parser.add_argument("--all", action="store_true", help="print every counter")
    args = parser.parse_args(argv)
    try:
        return run_stat(args.socket, json_out=args.json, watch=args.watch, all_fields=args.all)
    except KvdError as err:
        return report(err)


if __name__ == "__main__":
    sys.exit(main())
