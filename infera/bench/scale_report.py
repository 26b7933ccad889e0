"""Tables (Markdown) and the paper extrapolation of ``kvd bench scale`` (its plots: :mod:`.scale_plots`).

Every target is checked as a ratio or a slope between two figures of the same run: LOOKUP at the
largest index against the smallest, eviction cost per key across sizes (log-log slope; 0 is O(1)),
put+get against memcpy at the same client count.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from infera.bench.scale_index import slope
from infera.units import format_size

TIB, TB, MIB = 1 << 40, 10**12, 1 << 20
TIERS = (("1 TiB RAM tier", TIB, "ram"), ("100 TB disk tier", 100 * TB, "disk"))
CHUNK_SIZES = (4 * MIB, 32 * MIB)


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 23: what it compares, the figure, the bound, whether it is met."""
    out: list[dict[str, Any]] = []

    def add(what: str, value: float | None, bound: str, met: bool | None) -> None:
        out.append({"target": what, "value": value, "bound": bound, "met": met})

    idx = res.get("index", [])
    if len(idx) >= 2:
        lo, hi = idx[0], idx[-1]
        r = hi["lookup1000_p50_us"] / lo["lookup1000_p50_us"]
        add(f"LOOKUP p50 at {hi['chunks']:,} ÷ at {lo['chunks']:,} chunks", r, "≤ 1.2", r <= 1.2)
        rc = hi["lookup1000_daemon_cpu_us"] / max(lo["lookup1000_daemon_cpu_us"], 1e-9)
        add("  the same, daemon CPU per LOOKUP", rc, "(≤ 1.2)", None)
        if "lookup_prompt_p50_us" in hi and "lookup_prompt_p50_us" in lo:
            rp = hi["lookup_prompt_p50_us"] / lo["lookup_prompt_p50_us"]
            add("  the same for a prompt's 1,000 keys in stored order", rp, "≤ 1.2", rp <= 1.2)
        add(
            f"memory per indexed chunk at {hi['chunks']:,}",
            hi["bytes_per_chunk"],
            "≤ 400 B",
            hi["bytes_per_chunk"] <= 400,
        )
        s = slope([(p["chunks"], p["put_evicting_us_per_chunk"]) for p in (lo, hi)])
        add(
            "PUT into a full arena, µs/key: log-log slope over index size",
            s,
            "≈ 0 (O(1)), ≤ 0.1",
            s is not None and s <= 0.1,
        )
    rs = res.get("restart", [])
    if rs:
        big = rs[-1]
        add(
            f"clean restart with {big['files']:,} files: start to serving",
            big["serving_s"],
            "≤ 1 s",
            big["serving_s"] <= 1,
        )
        add(
            f"clean restart with {big['files']:,} files: index complete ({big['index_source']})",
            big["loaded_s"],
            "≤ 10 s",
            big["loaded_s"] <= 10,
        )
        crash = big.get("crash")
        if crash:
            add(
                f"restart after kill -9 with {crash['files']:,} files: start to serving",
                crash["serving_s"],
                "≤ 1 s",
                crash["serving_s"] <= 1,
            )
            add(
                f"restart after kill -9: index complete ({crash['index_source']})",
                crash["loaded_s"],
                "≤ 10 s",
                crash["loaded_s"] <= 10,
            )
            add(
                "  restart after kill -9: reconcile with the files finished",
                crash["reconciled_s"],
                "(shown)",
                None,
            )
        add("  start with no snapshot (scan): start to serving", big["scan_serving_s"], "(≤ 1 s)", None)
        add("  start with no snapshot (scan): index complete", big["scan_loaded_s"], "(shown)", None)
    conc = res.get("concurrency", {})
    for row in conc.get("rows", []):
        n = row["clients"]
        add(f"put+get ÷ memcpy, {n} client processes, 1 chunk a request", row["ratio"], "(shown)", None)
        if "ratio_step" in row:  # the target: the connector's pattern (infera.bench.scale_conc)
            add(
                f"put+get ÷ memcpy, {n} client processes, {conc['step_chunks']} chunks a request",
                row["ratio_step"],
                "≥ 0.8" if n in (2, 4) else "(2 cores: shown)",
                row["ratio_step"] >= 0.8 if n in (2, 4) else None,
            )
    cpu = res.get("cpu", {}).get("windows", {}).get("default", {})
    if "idle" in cpu:
        add(
            "idle daemon CPU, % of one core",
            cpu["idle"]["cpu_pct"],
            "0 % (< 0.5 % at 10 ms ticks)",
            cpu["idle"]["cpu_pct"] < 0.5,
        )
    return out


def extrapolate(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Chunks, index memory, restart time and LOOKUP cost of a 1 TiB RAM tier and a 100 TB disk
    tier, from the measured per-chunk figures and slopes (paper figures, not measurements)."""
    idx, rs = res.get("index", []), res.get("restart", [])
    if len(idx) < 2 or len(rs) < 2:
        return []
    hi = idx[-1]
    look_slope = slope([(p["chunks"], p["lookup1000_p50_us"]) for p in (idx[0], hi)]) or 0.0
    per_file_s = (rs[-1]["loaded_s"] - rs[0]["loaded_s"]) / (rs[-1]["files"] - rs[0]["files"])
    per_file_b = (rs[-1]["rss_anon_bytes"] - rs[0]["rss_anon_bytes"]) / (rs[-1]["files"] - rs[0]["files"])
    rows = []
    for label, capacity, kind in TIERS:
        for size in CHUNK_SIZES:
            chunks = capacity // size
            per = hi["bytes_per_chunk"] if kind == "ram" else per_file_b
            rows.append(
                {
                    "tier": label,
                    "chunk_bytes": size,
                    "chunks": chunks,
                    "index_bytes": chunks * per,
                    "restart_s": chunks * per_file_s if kind == "disk" else None,
                    "lookup1000_p50_us": hi["lookup1000_p50_us"] * (chunks / hi["chunks"]) ** look_slope,
                }
            )
    return rows


def _crash_cells(c: dict[str, Any] | None) -> str:
    if not c:
        return "– | – | – | – | "
    return (
        f"{c['serving_s']:.2f} s | {c['loaded_s']:.2f} s | {c['reconciled_s']:.2f} s | {c['index_source']} | "
    )


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def _table(
    title: str, columns: list[str], rows: Iterable[str] = (), image: str | None = None, intro: str = ""
) -> list[str]:
    """One section: its heading, plot and intro, then a table of ``columns`` and ``rows``."""
    out = ["", f"### {title}", ""]
    if image:
        out += [f"![{title.lower()}]({image})", ""]
    if intro:
        out += [intro, ""]
    return [*out, "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows]


def markdown(res: dict[str, Any], img: str) -> str:
    m = res["machine"]
    lines = [
        f"Command: `{res['command']}` ({res['mode']} mode), run {res['date']}, took {res['seconds']:.0f} s. "
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB, Python {m['python']}. "
        f"Load average (1/5/15 min) before: {res['load_before']}, after: {res['load_after']}.",
        *_table("Targets", ["target", "measured", "bound", "met"]),
    ]
    for t in res["targets"]:
        met = {True: "yes", False: "**no**", None: ""}[t["met"]]
        lines.append(f"| {t['target']} | {_f(t['value'])} | {t['bound']} | {met} |")
    lines += _table(
        "Index size",
        [
            *("chunks", "bytes/chunk", "LOOKUP 1,000 p50", "p99", "daemon CPU per LOOKUP"),
            *("LOOKUP of a prompt p50", "GET p50"),
            *("PUT chunks/s", "PUT into full arena µs/key", "eviction µs/key"),
        ],
        (
            f"| {p['chunks']:,} | {p['bytes_per_chunk']:.0f} | {p['lookup1000_p50_us']:.0f} µs | "
            f"{p['lookup1000_p99_us']:.0f} µs | {p['lookup1000_daemon_cpu_us']:.0f} µs | "
            f"{p.get('lookup_prompt_p50_us', 0):.0f} µs | {p['get_p50_us']:.0f} µs | "
            f"{p['put_chunks_per_s']:,.0f} | {p['put_evicting_us_per_chunk']:.2f} | {p['eviction_us_per_chunk']:.2f} |"
            for p in res.get("index", [])
        ),
        image=f"{img}/scale-index.png",
    )
    lines += _table(
        "Restart",
        [
            *("chunk files", "no snapshot (scan): start to serving", "index complete"),
            *("clean restart: start to serving", "index complete", "index from"),
            *("after kill -9: start to serving", "index complete", "reconcile done", "index from"),
            *("memory after", "per file"),
        ],
        (
            f"| {p['files']:,} | {p['scan_serving_s']:.2f} s | {p['scan_loaded_s']:.2f} s | "
            f"{p['serving_s']:.2f} s | {p['loaded_s']:.2f} s | {p['index_source']} | "
            + _crash_cells(p.get("crash"))
            + f"{format_size(p['rss_anon_bytes'])} | {p['rss_over_empty_per_file']:.0f} B |"
            for p in res.get("restart", [])
        ),
        image=f"{img}/scale-restart.png",
        intro="Each count: a start that finds no index snapshot and scans every file, then a clean "
        "restart that adopts the snapshot written by the first daemon's stop, then a daemon that "
        "writes 1,000 more chunks, is killed with -9 and started again (checkpoint + journal, then "
        "the reconcile lists the tree; its files count includes those chunks).",
    )
    conc = res.get("concurrency")
    if conc:
        step = conc.get("step_chunks", 0)

        def _rounds(xs: list[float]) -> str:
            return ", ".join(f"{x:.2f}" for x in xs)

        lines += _table(
            "Concurrency",
            [
                "client processes",
                "memcpy GB/s",
                "kvd GB/s, 1 chunk a request",
                "ratio",
                f"memcpy GB/s, {step} at a time",
                f"kvd GB/s, {step} chunks a request",
                "ratio",
                f"rounds (1; {step})",
            ],
            (
                f"| {r['clients']} | {r['memcpy_gbps']:.2f} | {r['kvd_gbps']:.2f} | {r['ratio']:.2f} | "
                f"{r.get('memcpy_step_gbps', 0):.2f} | {r.get('kvd_step_gbps', 0):.2f} | "
                f"{r.get('ratio_step', 0):.2f} | "
                f"{_rounds(r['ratio_rounds'])}; {_rounds(r.get('ratio_step_rounds', []))} |"
                for r in conc["rows"]
            ),
            image=f"{img}/scale-concurrency.png",
            intro=(
                f"put+get of {format_size(conc['chunk_bytes'])} chunks, best of rounds; one PUT and "
                f"one GET per chunk, and {step} chunks a request as the connector reserves and "
                f"leases a step's chunks, each against memcpy in the same order ({step} in, then "
                f"{step} out); the target is read from the second:"
            ),
        )
        lines += [
            "",
            f"LOOKUP of 1,000 keys, daemon otherwise idle: p50 {conc['lookup_idle_p50_us']:.0f} µs, "
            f"p99 {conc['lookup_idle_p99_us']:.0f} µs; while {conc['stream_clients']} clients stream: "
            f"p50 {conc['lookup_streaming_p50_us']:.0f} µs, p99 {conc['lookup_streaming_p99_us']:.0f} µs "
            f"({conc['lookup_streaming_samples']} LOOKUPs, {conc['streamed_chunks']} chunks streamed).",
        ]
    lines += _table(
        "Namespaces",
        ["namespaces", "chunks", "LOOKUP p50", "p99", "bytes/chunk"],
        (
            f"| {p['namespaces']} | {p['chunks']:,} | {p['lookup_p50_us']:.0f} µs ({p['lookup_keys']} keys) | "
            f"{p['lookup_p99_us']:.0f} µs | {p['bytes_per_chunk']:.0f} |"
            for p in res.get("namespaces", [])
        ),
    )
    cpu = res.get("cpu")
    if cpu:
        lines += _table(
            "Daemon CPU",
            [
                "traffic",
                "default 1 ms window: CPU %",
                "µs CPU/request",
                "`--busy-poll-us 0`: CPU %",
                "µs CPU/request",
            ],
        )
        d, z = cpu["windows"]["default"], cpu["windows"]["no_poll"]
        lines.append(
            f"| idle ({cpu['idle_s']:g} s) | {d['idle']['cpu_pct']:.2f} | | {z['idle']['cpu_pct']:.2f} | |"
        )
        for k in d:
            if k == "idle":
                continue
            a, b = d[k], z[k]
            lines.append(
                f"| a PING every {a['gap_us']} µs ({a['requests_per_s']:,.0f}/s) | {a['cpu_pct']:.1f} | "
                f"{a['cpu_us_per_request']:.0f} | {b['cpu_pct']:.1f} | {b['cpu_us_per_request']:.0f} |"
            )
    ext = res.get("extrapolation")
    if ext:
        lines += _table(
            "Paper extrapolation",
            ["tier", "chunk", "chunks", "index memory", "restart (index complete)", "LOOKUP 1,000 p50"],
        )
        for e in ext:
            restart = "–" if e["restart_s"] is None else f"{e['restart_s']:,.0f} s"
            lines.append(
                f"| {e['tier']} | {format_size(e['chunk_bytes'])} | {e['chunks']:,} | "
                f"{format_size(e['index_bytes'])} | {restart} | {e['lookup1000_p50_us']:,.0f} µs |"
            )
    return "\n".join(lines) + "\n"


__all__ = ["extrapolate", "markdown", "targets"]
