"""kvd inside vLLM's own metrics, seen through a real Prometheus.

One daemon (RAM + disk tier, ``--metrics-port``), one ``python -m infera.engine.vllm`` server and
one Prometheus scraping both every second. A separate engine process stores two prompts; the
server then gets the first from kvd's RAM tier, the daemon restarts (RAM gone, disk kept), and
the server gets the second from the disk tier. Everything below is asked of Prometheus's HTTP API:
kvd's ``vllm:`` counters, the daemon's ``kvd_`` counters, vLLM's
``vllm:prompt_tokens_cached_by_source`` (0.32+: ``host`` for the RAM hit, ``disk`` for the disk
one), the shipped alert rules evaluating cleanly, and every metric the shipped dashboard charts.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import Server, prompt, run_engine, start_server, vllm_version
from promserver import PromServer, binary

from helpers import REPO, Daemon, free_port, seconds_until

pytestmark = [
    pytest.mark.skipif(binary("prometheus") is None, reason="prometheus is not installed (setup.sh --all)"),
]

P_RAM = prompt(21, 600)  # 2 chunks from RAM
P_DISK = prompt(22, 600)  # 2 chunks from disk, after the restart
CHUNK = 256
HIT = 2 * CHUNK
DASHBOARD = REPO / "deploy" / "grafana" / "kvd.json"
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
ONLY_032 = {"vllm:prompt_tokens_cached_by_source_total"}  # vLLM 0.32+ only
DISTRIBUTED_ONLY = {"kvd_tier_connected", "kvd_tier_timeouts_total"}  # not served by the disk tier here


@pytest.fixture(scope="module")
def kvd(module_tmp: Path) -> Iterator[Daemon]:
    long = module_tmp / "long"
    long.mkdir()
    port = free_port()
    args = [
        "--max-bytes",
        "64M",
        "--long-path",
        str(long),
        "--long-bytes",
        "256M",
        "--metrics-port",
        str(port),
    ]
    d = Daemon(str(module_tmp / "kvd.sock"), args, module_tmp / "kvd.log").start()
    d.metrics_port = port  # type: ignore[attr-defined]
    yield d
    d.stop()


@pytest.fixture(scope="module")
def server(tiny_model: str, kvd: Daemon, module_tmp: Path) -> Iterator[Server]:
    with start_server(tiny_model, kvd.socket, module_tmp) as srv:
        yield srv


@pytest.fixture(scope="module")
def prom(kvd: Daemon, server: Server, module_tmp: Path) -> Iterator[PromServer]:
    jobs = {"kvd": [f"127.0.0.1:{kvd.metrics_port}"], "vllm": [f"127.0.0.1:{server.port}"]}  # type: ignore[attr-defined]
    p = PromServer(jobs, module_tmp, rule_files=[RULES]).start()
    try:
        p.wait_for('min(up{job=~"kvd|vllm"})', lambda v: v == 1, "both targets up", timeout=30)
        yield p
    finally:
        p.stop()


HOST = 'sum(vllm:prompt_tokens_cached_by_source_total{source="host"})'
DISK = 'sum(vllm:prompt_tokens_cached_by_source_total{source="disk"})'
KVD_HITS = 'sum(vllm:kvd_hit_tokens_total{tier="%s"})'


@pytest.fixture(scope="module")
def story(prom: PromServer, server: Server, kvd: Daemon, tiny_model: str, module_tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"v032": vllm_version() >= (0, 32), "t0": time.time()}
    # A hit loads HIT tokens and computes the rest, so what it must equal is this server's own
    # answer for the same split: the first HIT tokens in vLLM's prefix cache, the rest computed
    # after them (retention none, before anything is stored: kvd holds nothing of it). Another
    # engine process is no reference: the server's worker runs two OpenMP threads, the offline
    # engine one, and on random bf16 weights a split prefill then flips a near tie in the tokens.
    for n, p in (("ram", P_RAM), ("disk", P_DISK)):
        server.complete(p[:HIT], retention="none")
        out[f"{n}-split"] = server.complete(p, retention="none")
        assert server.http.post("/reset_prefix_cache").status_code == 200
    steps = [{"op": "generate", "name": n, "prompt": p} for n, p in (("ram", P_RAM), ("disk", P_DISK))]
    out["writer"] = run_engine(tiny_model, steps, socket=kvd.socket, workdir=module_tmp)

    out["ram"] = server.complete(P_RAM)
    prom.wait_for(KVD_HITS % "ram", lambda v: (v or 0) >= HIT, "kvd's RAM hit in vllm:kvd_hit_tokens")
    if out["v032"]:
        prom.wait_for(HOST, lambda v: (v or 0) >= HIT, "the RAM hit counted as host")
    out["kvd_hits_before_restart"] = prom.wait_for(
        "kvd_hits_total", lambda v: (v or 0) >= 2, "the daemon's hits_total"
    )

    def written() -> bool:
        long = kvd.stats()["tiers"]["long"]
        return bool(long["queued_writes"] == 0 and long["chunks"] >= 4)

    seconds_until(written, 30, "disk writes", poll_s=0.1)
    kvd.restart()
    out["disk"] = server.complete(P_DISK)
    prom.wait_for(KVD_HITS % "disk", lambda v: (v or 0) >= HIT, "kvd's disk hit in vllm:kvd_hit_tokens")
    if out["v032"]:
        prom.wait_for(DISK, lambda v: (v or 0) >= HIT, "the disk hit counted as disk")
    prom.wait_for('kvd_tier_hits_total{tier="long"}', lambda v: (v or 0) >= 2, "the daemon's disk hits")
    return out


def test_outputs_match_vllm_for_the_same_split(story: dict[str, Any]) -> None:
    assert story["ram"] == story["ram-split"]
    assert story["disk"] == story["disk-split"]


def test_kvd_vllm_counters_in_prometheus(prom: PromServer, story: dict[str, Any]) -> None:
    v = prom.value
    assert v(KVD_HITS % "ram") == HIT
    assert v(KVD_HITS % "disk") == HIT
    assert v(KVD_HITS % "distributed") == 0
    assert v("sum(vllm:kvd_loaded_chunks_total)") == 4
    assert (v("sum(vllm:kv_offload_load_bytes_total)") or 0) > 0, "vLLM's offload name charts kvd's loads"
    assert v("sum(vllm:kvd_load_duration_seconds_count)") == 2, "one load step per request"
    assert (v("sum(vllm:kvd_load_duration_seconds_sum)") or 0) > 0
    assert (v("sum(vllm:kv_offload_load_size_sum)") or 0) == v("sum(vllm:kv_offload_load_bytes_total)")
    assert v("sum(vllm:kvd_failed_loads_total)") == 0
    assert v("sum(vllm:kvd_dropped_saves_total)") == 0
    assert v("sum(vllm:kvd_lookups_total)") >= 2  # type: ignore[operator]
    row = prom.query("vllm:kvd_data_path_info == 1")
    assert [r["metric"]["data_path"] for r in row] == ["arena"]
    assert row[0]["metric"]["model_name"] == "tiny" and row[0]["metric"]["engine"] == "0"
    assert v("max(vllm:kvd_data_path_fallback)") == 0


def test_daemon_counters_in_prometheus(prom: PromServer, story: dict[str, Any]) -> None:
    assert story["kvd_hits_before_restart"] >= 2
    v = prom.value
    assert v('up{job="kvd"}') == 1
    assert (v('kvd_tier_read_bytes_total{tier="long"}') or 0) > 0
    assert v("changes(kvd_start_time_seconds[5m])") == 1, "the restart is visible"
    clients = prom.query('kvd_clients{name=~"vllm:.*"}')
    assert clients, "the server's connector shows as clients by name and role"
    assert all("pid" not in r["metric"] for r in clients)
    assert v("sum(kvd_clients_fallback)") == 0
    assert v("kvd_hash_conflicts") == 0


def test_cached_by_source_counts_ram_as_host_and_disk_as_disk(
    prom: PromServer, story: dict[str, Any]
) -> None:
    if not story["v032"]:
        pytest.skip("vllm:prompt_tokens_cached_by_source is vLLM 0.32+")
    assert prom.value(HOST) == HIT
    assert prom.value(DISK) == HIT
    assert prom.value('sum(vllm:prompt_tokens_cached_by_source_total{source="external_unspecified"})') == 0
    # vLLM's help text: the sources sum to local + external prefix-cache hits
    total = prom.value("sum(vllm:prompt_tokens_cached_by_source_total)")
    parts = prom.value("sum(vllm:prefix_cache_hits_total) + sum(vllm:external_prefix_cache_hits_total)")
    assert total == parts


def test_kv_transfer_log_line(server: Server, story: dict[str, Any]) -> None:
    deadline = time.monotonic() + 15
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = re.findall(r"KV Transfer metrics: (.*)", server.log())
        if any("loaded_chunks=2" in ln for ln in lines):
            break
        time.sleep(0.5)
    assert any("loaded_chunks=2" in ln and "hit_tokens_ram=512" in ln for ln in lines), lines[-5:]
    # the data path is on the first line and then only on a line where it changed
    assert {p for ln in lines for p in re.findall(r"data_path=(\w+)", ln)} == {"arena"}, lines[-5:]
    assert any("hit_tokens_disk=512" in ln for ln in lines), lines[-5:]


def test_shipped_rules_evaluate_cleanly(prom: PromServer, story: dict[str, Any]) -> None:
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert rules and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = {r["metric"]["alertname"] for r in prom.query('ALERTS{alertstate="firing"}')}
    assert not firing, firing


def dashboard_metrics() -> set[str]:
    """Every metric name in the dashboard's queries (PromQL functions and labels left out)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", []) if t.get("expr")]
    exprs += [
        v["query"]["query"] for v in board.get("templating", {}).get("list", []) if v.get("type") == "query"
    ]
    names: set[str] = set()
    for expr in exprs:
        expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
        expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
        expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
        names |= {n for n in re.findall(r"\b((?:vllm:|kvd_)[A-Za-z0-9_:]+)", expr)}
    return names


def test_every_dashboard_metric_exists_in_the_live_scrape(prom: PromServer, story: dict[str, Any]) -> None:
    names = dashboard_metrics()
    assert len(names) > 20 and any(n.startswith("vllm:kvd_") for n in names)
    live = prom.series_names()
    expected = (names if story["v032"] else names - ONLY_032) - DISTRIBUTED_ONLY
    missing = sorted(n for n in expected if n not in live)
    assert not missing, f"dashboard panels with no data: {missing}"


def test_dump_dashboard_series(prom: PromServer, story: dict[str, Any]) -> None:
    """With INFERA_OBS_DUMP=FILE: every dashboard query over this run, as Prometheus answers it
    (deploy/grafana/plot.py draws docs/img/observability-dashboard.png from it)."""
    path = os.environ.get("INFERA_OBS_DUMP")
    if not path:
        pytest.skip("set INFERA_OBS_DUMP=FILE to keep the dashboard's series")
    board = json.loads(DASHBOARD.read_text())
    end = time.time()
    out: dict[str, Any] = {"start": story["t0"], "end": end, "panels": []}
    subst = {"$__rate_interval": "4s", "$instance": ".*", "$model_name": ".*"}
    for p in board["panels"]:
        if p["type"] == "row":
            out["panels"].append({"row": p["title"]})
            continue
        series = []
        for t in p["targets"]:
            expr = t["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            data = prom.api("query_range", query=expr, start=str(story["t0"]), end=str(end), step="1")
            for r in data["result"]:
                labels = r["metric"]
                legend = re.sub(
                    r"\{\{(\w+)\}\}", lambda m, lab=labels: lab.get(m.group(1), ""), t["legendFormat"]
                )
                series.append({"legend": legend, "values": [[float(a), float(b)] for a, b in r["values"]]})
        out["panels"].append(
            {
                "title": p["title"],
                "type": p["type"],
                "unit": p["fieldConfig"]["defaults"]["unit"],
                "series": series,
            }
        )
    Path(path).write_text(json.dumps(out))
