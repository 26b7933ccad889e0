"""``kvd bench compare`` cannot rot silently: its smallest real piece, the store-throughput table
with tiny chunks for kvd, Redis and memcpy, a peer that fails at start, and the docs writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infera.bench.compare import BEGIN, END, write_outputs
from infera.bench.compare_report import store_table
from infera.bench.compare_runs import run_store


class Steps:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def note(self, text: str) -> None:
        pass

    def step(self, text: str) -> None:
        self.seen.append(text)


@pytest.mark.timeout(120)
def test_store_part_and_docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("INFERA_TEST_LMCACHE_SERVER", "/bin/false")  # a peer that cannot start
    steps = Steps()
    store = run_store(tmp_path / "work", 256 << 10, 4, 1, ("kvd", "redis", "lmcache_server"), steps)
    rows = store["rows"]
    assert steps.seen == ["store: memcpy", "store: kvd", "store: redis", "store: lmcache_server"]
    for name in ("memcpy", "kvd", "redis"):
        assert rows[name]["put_gbps"] > 0 and rows[name]["get_gbps"] > 0, rows[name]
    # the failing peer is reported with its error, not dropped
    assert "exited with 1 at start" in rows["lmcache_server"]["error"]

    table = store_table(store)
    kvd_line = next(ln for ln in table.splitlines() if ln.startswith("| kvd"))
    put = rows["kvd"]["put_gbps"]
    assert f"{put:.2f}" in kvd_line
    assert f"{put / rows['redis']['put_gbps']:.2f}×" in kvd_line  # ÷ best peer (Redis is the only one)
    assert f"{put / rows['memcpy']['put_gbps']:.2f}×" in kvd_line  # ÷ limit
    assert "could not run: " in table

    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    docs.write_text(f"# Benchmarks\n\n## Someone else's section\n\nkept\n\n{BEGIN}\nold\n{END}\n\ntail\n")
    results = {
        "command": "kvd bench compare --only store",
        "mode": "quick",
        "date": "today",
        "seconds": 1.0,
        "machine": {"cpu": "cpu", "cpus": 2, "memory_gib": 1, "kernel": "k", "python": "3"},
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [1.0, 1.0, 1.0],
        "versions": {},
        "store": store,
    }
    write_outputs(results, tmp_path / "out", docs)
    text = docs.read_text()
    assert "Someone else's section\n\nkept" in text and text.endswith("tail\n")
    assert "old" not in text and kvd_line in text and "](img/compare-store.png)" in text
    assert (docs.parent / "img" / "compare-store.png").stat().st_size > 10_000
    assert (
        json.loads((tmp_path / "out" / "results.json").read_text())["store"]["rows"]["kvd"]["put_gbps"] == put
    )


def _req(name: str, seconds: float, hits: float, token: int = 7) -> dict[str, object]:
    tokens = int(name.split("/")[0])
    return {
        "name": name,
        "tokens": tokens,
        "seconds": seconds,
        "external_hits": hits,
        "cached_tokens": 0,
        "token": [token],
    }


def test_ttft_best_peer_ignores_peers_that_loaded_nothing() -> None:
    """A peer that ran but loaded nothing (LMCache in degraded mode here) is not the best peer,
    even when faster; the best of repeats is kept; a failed peer keeps its error."""
    from infera.bench.compare_report import best_ttft_peer, ttft_tables
    from infera.bench.compare_ttft import summarize

    engines = {
        "recompute": {"requests": [_req("1024/recompute", 2.0, 0), _req("1024/prefix-cache", 0.2, 0)]},
        "kvd": {
            "requests": [_req("1024/store", 2.1, 0), _req("1024/hit", 0.5, 768), _req("1024/hit", 0.4, 768)]
        },
        "example": {
            "requests": [_req("1024/store", 2.1, 0), _req("1024/hit", 0.3, 896, token=8)],
            "error": "RuntimeError: shape mismatch",
            "failed_request": "2048/hit",
        },
        "lmcache": {"requests": [_req("1024/hit", 0.1, 0)], "log_errors": ["RuntimeError: boom"]},
        "lmcache-restart": {"requests": [], "error": "not measured: boom"},
    }
    rows = summarize(engines, [1024, 2048])
    assert rows["kvd_ram"]["by_size"]["1024"]["seconds"] == 0.4
    assert rows["kvd_ram"]["by_size"]["1024"]["samples"] == [0.5, 0.4]
    assert rows["example"]["by_size"]["1024"]["same_token"] is False
    assert best_ttft_peer(rows, "1024") == ("example", 0.3)
    table = ttft_tables({"sizes": [1024, 2048], "rows": rows})
    kvd_line = next(ln for ln in table.splitlines() if ln.startswith("| kvd, RAM hit |"))
    assert "| 400 ms | 768 | 5.0× | 1.33× | 2.00× | yes |" in kvd_line
    assert "could not run: not measured: boom" in table
    assert "| LMCache, CPU tier (error in the engine's log: RuntimeError: boom) | 100 ms | 0 |" in table
    # a peer that failed at one prompt length keeps its figures for the others
    assert "| ExampleConnector | 300 ms | 896 |" in table
    assert "| ExampleConnector | could not run (request 2048/hit): RuntimeError: shape mismatch |" in table
