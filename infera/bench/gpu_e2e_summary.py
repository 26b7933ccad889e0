"""The summary of a ``kvd bench gpu-e2e`` run: each model and length's rows, from the engines' records.

Per row: the median TTFT, ratios to recompute and to vLLM's native CPU hit, the effective load
bandwidth (bytes loaded over the TTFT above the warm GPU hit), the worker's own DMA rate, and the
token check against the warm GPU hit (or, for a hit the load policy cut short, against vLLM's own
answer for the same cut).
"""

from __future__ import annotations

import statistics
from typing import Any

from infera.bench import gpu_e2e_report as report
from infera.bench.gpu_e2e_models import loaded_bytes


def summarize(
    records: list[dict[str, Any]], models: list[dict[str, Any]], ceiling: float | None, policy: str = "auto"
) -> dict[str, Any]:
    """Rows per model and size, ratios, bandwidth and the token check."""
    out: dict[str, Any] = {"models": []}
    by = {(r.get("model"), r.get("role"), r.get("tokens")): r for r in records if r["_kind"] == "RESULT"}
    for m in models:
        for n in m["sizes"]:
            a = by.get((m["name"], "kvd-a", n), {})
            nat = by.get((m["name"], "native", n), {})
            b = by.get((m["name"], "kvd-b", n), {})
            d = by.get((m["name"], "kvd-disk", n), {})
            warm = a.get("warm") or nat.get("warm") or []
            floor = report.median_ms(warm)
            cases = {
                "recompute": a.get("recompute") or [],
                "native CPU hit": nat.get("hit") or [],
                "kvd RAM hit, same engine": a.get("hit") or [],
                "kvd RAM hit, other engine": b.get("cross") or [],
                "kvd disk hit after restart": d.get("disk") or [],
                "kvd hit after the disk hit": d.get("after_disk") or [],
                "warm GPU prefix hit": warm,
            }
            if not cases["kvd hit after the disk hit"]:  # records of a run before it was measured
                del cases["kvd hit after the disk hit"]
            rec = report.median_ms(cases["recompute"])
            nat_ms = report.median_ms(cases["native CPU hit"])
            rows = []
            # a hit computes the prompt's tail from restored KV; so does a warm GPU hit from the
            # engine's own KV (same tail length when the prompt is k chunks + 1 token): equal
            # tokens mean the KV came back bit for bit. Recompute (a full prefill) can differ in
            # the last bits (other kernel shapes); it is shown, not required.
            ref = (a.get("warm") or nat.get("warm") or [{}])[0].get("tokens")
            disk_ref = [x.get("tokens") for x in a.get("disk_warm") or []]
            disk_ref_cases = ("kvd disk", "kvd hit after the disk")
            for name, samples in cases.items():
                ms = report.median_ms(samples)
                row: dict[str, Any] = {"case": name, "ms": ms, "n": len(samples)}
                row.update(report.policy_fields(name, samples, policy))
                row["vs_recompute"] = ms / rec if ms and rec else None
                row["vs_native"] = ms / nat_ms if ms and nat_ms else None
                if samples and name not in ("recompute", "warm GPU prefix hit"):
                    cached = statistics.median(s.get("cached", 0) for s in samples)
                    row["cached_tokens"] = cached
                    if ms and floor and ms > floor:
                        row["load_gbps"] = loaded_bytes(m, cached) / ((ms - floor) / 1000) / 1e9
                    dma = [s for s in samples if s.get("load_dma_us")]
                    if dma:
                        row["dma_gbps"] = statistics.median(
                            s["load_dma_bytes"] / s["load_dma_us"] / 1e3 for s in dma
                        )
                if samples and name != "recompute":
                    disk_case = name.startswith(disk_ref_cases)
                    want = disk_ref if disk_case else [ref] * len(samples)
                    got = [s.get("tokens") for s in samples]
                    row["tokens_match"] = bool(ref) and all(
                        w is not None and g == w for g, w in zip(got, want, strict=False)
                    )
                    splits = a.get("disk_split_ref") if disk_case else [a.get("split_ref")] * len(samples)
                    row.update(report.cut_check(samples, splits or [], n))
                if name == "recompute" and samples:
                    row["tokens_match"] = bool(ref) and all(s.get("tokens") == ref for s in samples)
                rows.append(row)
            hma = {
                r.get("role"): r.get("hma")
                for r in records
                if r["_kind"] == "INFO" and r.get("model") == m["name"] and "hma" in r
            }
            extra = {
                "hybrid_manager": hma or None,
                "native_store_ms": (nat.get("store") or {}).get("ms"),
                "kvd_store_ms": (a.get("store") or {}).get("ms"),
                "seal_wait_s": a.get("seal_wait_s"),
            }
            out["models"].append(
                {"model": m["name"], "tokens": n, "rows": rows, "ceiling_h2d_gbps": ceiling, **extra}
            )
    return out
