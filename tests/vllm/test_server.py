"""``python -m infera.engine.vllm`` as the product doc runs it: the OpenAI server, the prewarm route,
InferaKvdConnector as a ``kv_both`` child of a ``kv_producer`` MultiConnector, and a daemon with a
disk long tier that restarts under the running engine; after the restart a fresh engine process
and the running server both get their hits back from disk.

vLLM's ExampleConnector stands in for the transport child (MooncakeConnector needs RDMA/GPUs).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import Server, example_multi_config, prompt, run_engine, start_server

from helpers import Daemon, seconds_until

P5 = prompt(5, 1000)  # long: 3 chunks, on disk
P6 = prompt(6, 600)  # short: 2 chunks, RAM only
P7 = prompt(7, 600)  # long: 2 chunks, prewarmed after the restart
CHUNK = 256


@pytest.fixture(scope="module")
def server(tiny_model: str, kvd: Daemon, module_tmp: Path) -> Iterator[Server]:
    storage = module_tmp / "example-connector"
    storage.mkdir()
    with start_server(
        tiny_model,
        kvd.socket,
        module_tmp,
        kv_transfer_config=example_multi_config(storage),
        extra_args=["--advertise-host", "127.0.0.1"],
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def story(server: Server, kvd: Daemon, tiny_model: str, module_tmp: Path) -> dict[str, Any]:
    """Store three prompts through the server, restart the daemon, load one from a fresh engine
    process, prewarm another through the route, then ask the server for both again."""
    out: dict[str, Any] = {}
    out["first"] = {"p5": server.complete(P5), "p6": server.complete(P6, "short"), "p7": server.complete(P7)}

    def written() -> bool:
        long = kvd.stats()["tiers"]["long"]
        return bool(long["queued_writes"] == 0 and long["chunks"] >= 5)

    seconds_until(written, 30, "disk writes", poll_s=0.1)
    out["before_restart"] = kvd.stats()
    kvd.restart()
    assert server.http.post("/reset_prefix_cache").status_code == 200
    fresh = run_engine(
        tiny_model, [{"op": "generate", "name": "p5", "prompt": P5}], socket=kvd.socket, workdir=module_tmp
    )
    out["fresh"] = fresh["p5"]
    out["after_fresh"] = kvd.stats()
    out["prewarm_p7"] = server.prewarm({"prompt": P7, "model": "tiny"}).json()
    out["prewarm_p6"] = server.prewarm({"prompt": P6}).json()
    seconds_until(lambda: kvd.stats()["chunks"] >= 5, 30, "prewarmed chunks in RAM", poll_s=0.1)
    out["after_prewarm"] = kvd.stats()
    out["second"] = {"p5": server.complete(P5), "p7": server.complete(P7)}
    out["after"] = kvd.stats()
    return out


def test_entry_point_adds_recompute_policy_and_ignores_pd_flags(server: Server) -> None:
    log = server.log()
    assert "kv_load_failure_policy='recompute'" in log
    assert "--advertise-host is for the P/D registration, which needs --etcd-endpoint" in log
    assert "Route: /v1/cache/prewarm" in log


def test_multiconnector_child_saves_long_and_short(story: dict[str, Any]) -> None:
    before = story["before_restart"]
    assert before["sets_total"] == 7
    assert before["chunks_by_class"]["short"] == 2
    assert before["chunks_by_class"]["long"] == 5


def test_short_retention_never_reaches_disk(story: dict[str, Any]) -> None:
    assert story["before_restart"]["tiers"]["long"]["chunks"] == 5
    assert story["prewarm_p6"] == {"chunks": 2, "queued": 0, "namespace": story["prewarm_p7"]["namespace"]}


def test_fresh_engine_hits_after_a_daemon_restart(story: dict[str, Any]) -> None:
    fresh = story["fresh"]
    assert fresh["external_hits"] == 3 * CHUNK
    assert fresh["tokens"] == story["first"]["p5"]
    after = story["after_fresh"]
    assert after["tiers"]["long"]["hits"] >= 3, "the chunks came back from disk"
    assert (after["sets_total"], after["gets_total"], after["hits_total"], after["misses_total"]) == (
        0,
        3,
        3,
        0,
    )


def test_prewarm_route_pulls_chunks_from_disk(story: dict[str, Any]) -> None:
    assert story["prewarm_p7"]["chunks"] == 2
    assert story["prewarm_p7"]["queued"] == 2
    assert story["after_prewarm"]["chunks"] == 3 + 2


def test_running_engine_hits_after_a_daemon_restart(story: dict[str, Any]) -> None:
    assert story["second"]["p5"] == story["first"]["p5"]
    assert story["second"]["p7"] == story["first"]["p7"]
    after = story["after"]
    assert after["gets_total"] == 3 + 3 + 2, "P5 by the fresh engine and the server, P7 by the server"
    assert after["hits_total"] == after["gets_total"]
    assert after["misses_total"] == 0


def test_external_hits_reach_the_engine_metrics(server: Server, story: dict[str, Any]) -> None:
    metrics = server.http.get("/metrics").text
    hits = [ln for ln in metrics.splitlines() if ln.startswith("vllm:external_prefix_cache_hits_total")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 5 * CHUNK


def test_the_engine_stats_line_shows_external_hits(server: Server, story: dict[str, Any]) -> None:
    """The check the product doc tells users to make: the engine's periodic stats line."""
    deadline = time.monotonic() + 15
    rates: list[float] = []
    while time.monotonic() < deadline:
        rates = [float(m) for m in re.findall(r"External prefix cache hit rate: ([\d.]+)%", server.log())]
        if any(r > 0 for r in rates):
            break
        time.sleep(0.5)
    assert rates and max(rates) > 0, "no stats line with a non-zero external prefix cache hit rate"


@pytest.mark.parametrize(
    ("body", "status", "code", "message"),
    [
        ({"prompt": "some text"}, 400, "no_tokenizer", "send token ids"),
        ({"prompt": [1, 2, 3], "model": "other"}, 404, "model_not_found", "not 'other'"),
        ({"tokens": [1, 2]}, 400, "bad_request", 'with "prompt"'),
        ({"prompt": [1, "x"]}, 400, "bad_request", "token id at position 1 is not an integer: 'x'"),
        ({"prompt": [1, 2.5]}, 400, "bad_request", "not an integer: 2.5"),
        ({"prompt": [5, 999999]}, 400, "invalid_token", "token id 999999 at position 1 is outside the vocabulary (size 1000)"),
        ({"prompt": [1000]}, 400, "invalid_token", "outside the vocabulary (size 1000)"),
        ({"prompt": [3, -1]}, 400, "invalid_token", "token id -1 at position 1 is negative"),
        ({"prompt": [7] * 3000}, 400, "prompt_too_long", "prompt of 3000 tokens exceeds max_model_len 2048"),
        ({"prompt": []}, 400, "empty_prompt", "the prompt is empty"),
        ({"prompt": ""}, 400, "empty_prompt", "the prompt is empty"),
    ],
)  # fmt: skip
def test_prewarm_errors_are_json(server: Server, body: Any, status: int, code: str, message: str) -> None:
    r = server.prewarm(body)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert message in r.json()["error"]["message"]


def test_kvd_metrics_reach_vllm_through_the_multiconnector(server: Server, story: dict[str, Any]) -> None:
    """Under a MultiConnector vLLM rebuilds each child's stats by class name: ours must be known."""
    metrics = server.http.get("/metrics").text
    loaded = [ln for ln in metrics.splitlines() if ln.startswith("vllm:kvd_loaded_chunks_total{")]
    assert loaded and sum(float(ln.rsplit(" ", 1)[1]) for ln in loaded) >= 5
    assert "Connector 'InferaKvdConnector' is not registered" not in server.log()
