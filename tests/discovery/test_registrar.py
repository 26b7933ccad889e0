"""The registrar against a real etcd: role mapping, readiness, leases, deregistration, etcd outages."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from services import Etcd, Service

from helpers import seconds_until
from infera.discovery.etcd import EtcdClient
from infera.discovery.record import HashInfo, WorkerInfo, build_record, worker_key
from infera.discovery.registrar import Registrar
from infera.kvd.process import wait_until

KVD = {"kv_connector": "InferaKvdConnector", "kv_role": "kv_both"}
MOONCAKE_P = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}


def multi(role: str | None, *children: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": list(children)},
    }
    if role is not None:
        cfg["kv_role"] = role
    return cfg


def info(ktc: dict[str, Any] | None, port: int = 8001) -> WorkerInfo:
    return WorkerInfo(
        "10.0.0.11", port, "org/model", ktc, HashInfo("0", "0.32.0", "sha256", 16, "env:0", "fp")
    )


def read(etcd: Etcd, key: str) -> dict[str, Any] | None:
    with EtcdClient(etcd.endpoint) as c:
        kv = c.get(key)
    return None if kv is None else dict(kv.json())


@pytest.fixture
def registrars() -> Iterator[Callable[..., Registrar]]:
    made: list[Registrar] = []

    def make(etcd_endpoint: str, wi: WorkerInfo, **kw: Any) -> Registrar:
        r = Registrar(etcd_endpoint, worker_key(None, wi.id), lambda: build_record(wi), **kw)
        made.append(r)
        return r.start()

    yield make
    for r in made:
        r.stop()


@pytest.mark.parametrize(
    ("ktc", "role"),
    [
        (multi("kv_producer", KVD, MOONCAKE_P), "prefill"),
        ({"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}, "decode"),
        (multi("kv_both", KVD, MOONCAKE_P), "mixed"),
        (multi(None, KVD, MOONCAKE_P), "mixed"),
        (None, "mixed"),
    ],
    ids=["kv_producer", "kv_consumer", "kv_both", "absent", "no-config"],
)
def test_role_comes_from_the_top_level_kv_role(
    etcd: Etcd, registrars: Callable[..., Registrar], ktc: dict[str, Any] | None, role: str
) -> None:
    r = registrars(etcd.endpoint, info(ktc), ttl=5)
    assert r.registered.wait(10)
    rec = read(etcd, "/infera-kvd/v1/workers/10.0.0.11:8001")
    assert rec is not None
    assert rec["role"] == role
    assert rec["kv_role"] == (ktc or {}).get("kv_role")
    assert rec["kvd"] is (ktc is not None and ktc["kv_connector"] == "MultiConnector")
    assert rec["url"] == "http://10.0.0.11:8001"
    assert rec["hash"] == {
        "python_hash_seed": "0",
        "vllm_version": "0.32.0",
        "algo": "sha256",
        "block_size": 16,
        "seed": "env:0",
        "fingerprint": "fp",
    }
    assert rec["lease"] == r.lease and rec["lease_ttl_s"] == 5


def test_registers_only_once_ready(etcd: Etcd, registrars: Callable[..., Registrar]) -> None:
    ready = threading.Event()
    r = registrars(etcd.endpoint, info(None), ttl=5, ready=ready.is_set, ready_interval=0.05)
    time.sleep(0.5)
    assert r.state == "waiting" and read(etcd, r.key) is None
    ready.set()
    assert r.registered.wait(5)
    assert read(etcd, r.key) is not None


def test_clean_stop_deregisters_at_once(etcd: Etcd, registrars: Callable[..., Registrar]) -> None:
    r = registrars(etcd.endpoint, info(None), ttl=30)
    assert r.registered.wait(10)
    assert r.stop() is True
    assert read(etcd, r.key) is None
    assert r.state == "stopped"


def test_lease_is_kept_alive_past_its_ttl(etcd: Etcd, registrars: Callable[..., Registrar]) -> None:
    r = registrars(etcd.endpoint, info(None), ttl=2)
    assert r.registered.wait(10)
    lease = r.lease
    time.sleep(4)
    assert read(etcd, r.key) is not None and r.lease == lease and r.registrations == 1


REGISTER_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from infera.discovery.record import HashInfo, WorkerInfo, build_record, worker_key
    from infera.discovery.registrar import Registrar
    wi = WorkerInfo("10.0.0.12", 8002, "org/model", {"kv_connector": "MooncakeConnector",
                    "kv_role": "kv_consumer"}, HashInfo("0", "0.32.0", "sha256", 16, "env:0", "fp"))
    r = Registrar(sys.argv[1], worker_key(None, wi.id), lambda: build_record(wi), ttl=2).start()
    r.registered.wait(20)
    print("REGISTERED", r.lease, flush=True)
    time.sleep(600)
    """
)


def test_kill_9_lets_the_lease_expire(etcd: Etcd) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", REGISTER_AND_WAIT, etcd.endpoint], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("REGISTERED"), line
        key = "/infera-kvd/v1/workers/10.0.0.12:8002"
        rec = read(etcd, key)
        assert rec is not None and rec["role"] == "decode"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gone = seconds_until(lambda: read(etcd, key) is None, 8, "the lease to expire", 0.05)
        assert gone <= 2 + 2.5, f"key lasted {gone:.1f} s after kill -9 with a 2 s lease"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_etcd_down_at_start_is_retried_and_counted(
    service_dir: Path,
    services: Callable[[Service], Service],
    registrars: Callable[..., Registrar],
    caplog: Any,
) -> None:
    later = Etcd(service_dir)
    caplog.set_level(logging.INFO, logger="infera.discovery")
    r = registrars(later.endpoint, info(None), ttl=5, backoff=(0.05, 0.2), timeout=0.5)
    wait_until(lambda: r.failures >= 3, 10, "three failed attempts", 0.05)
    assert r.state == "retrying" and not r.registered.is_set()
    services(later)
    assert r.registered.wait(10)
    rec = read(later, r.key)
    assert rec is not None and rec["registration_failures"] == r.failures >= 3
    warnings = [m for m in caplog.messages if "cannot register" in m]
    assert len(warnings) == 1, "one line per outage, not one per retry"
    assert "keeps serving" in warnings[0]
    assert any("reachable again" in m for m in caplog.messages)


def test_a_lost_lease_is_replaced(etcd: Etcd, registrars: Callable[..., Registrar]) -> None:
    r = registrars(etcd.endpoint, info(None), ttl=3)
    assert r.registered.wait(10)
    old = r.lease
    assert old is not None
    with EtcdClient(etcd.endpoint) as c:
        c.revoke(old)  # as if etcd had been unreachable for longer than the TTL
    wait_until(lambda: r.registrations == 2, 5, "a second registration", 0.05)
    rec = read(etcd, r.key)
    assert rec is not None and rec["lease"] == r.lease != old


def test_a_record_that_cannot_be_built_is_logged_not_raised(etcd: Etcd, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="infera.discovery")

    def broken() -> dict[str, Any]:
        raise RuntimeError("no engine config")

    r = Registrar(etcd.endpoint, "/infera-kvd/v1/workers/x:1", broken, ttl=5).start()
    wait_until(lambda: r.state == "failed", 5, "the failed state", 0.05)
    r.stop()
    assert any("no engine config" in m for m in caplog.messages)


def test_record_is_compact_json(etcd: Etcd, registrars: Callable[..., Registrar]) -> None:
    r = registrars(etcd.endpoint, info(multi("kv_producer", KVD, MOONCAKE_P)), ttl=5)
    assert r.registered.wait(10)
    with EtcdClient(etcd.endpoint) as c:
        kv = c.get(r.key)
    assert kv is not None and kv.lease == r.lease
    assert json.loads(kv.value)["connectors"] == [
        {"name": "InferaKvdConnector", "kv_role": "kv_both"},
        {"name": "MooncakeConnector", "kv_role": "kv_producer"},
    ]
