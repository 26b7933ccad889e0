"""``kvd doctor --etcd``: the pd-workers check against a real etcd holding real registrations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from services import Etcd, free_port

from infera.discovery.etcd import EtcdClient
from infera.discovery.record import HashInfo, WorkerInfo, build_record, worker_key
from infera.discovery.registrar import Registrar
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.model import CheckResult, Status
from infera.doctor.run import run_doctor

KVD_BIN = Path(sys.executable).with_name("kvd")
KVD = {"kv_connector": "InferaKvdConnector", "kv_role": "kv_both"}
MC_P = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
MC_D = {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}
HASH = HashInfo("0", "0.32.0", "sha256", 16, "env:0", "fp0")


def prefill_ktc(top: str | None = "kv_producer") -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [KVD, MC_P]},
    }
    if top:
        cfg["kv_role"] = top
    return cfg


def worker(
    host: str, port: int, ktc: dict[str, Any] | None, hash: HashInfo = HASH, model: str = "org/m"
) -> WorkerInfo:
    return WorkerInfo(host, port, model, ktc, hash, request_transport="http", kv_event_transport="zmq")


def put(etcd: Etcd, *workers: WorkerInfo) -> None:
    with EtcdClient(etcd.endpoint) as c:
        lease, _ = c.grant(60)
        for w in workers:
            c.put(worker_key(None, w.id), json.dumps(build_record(w, lease=lease)), lease=lease)


def doctor(etcd_endpoint: str | None, prefix: str | None = None) -> CheckResult:
    opts = DoctorOptions(checks=["pd-workers"], etcd=etcd_endpoint, etcd_prefix=prefix)
    return run_doctor(ctx=Context(opts, processes=lambda: [])).get("pd-workers").result


PREFILL = worker("10.0.0.11", 8001, prefill_ktc())
DECODE = worker("10.0.0.12", 8002, MC_D)


def test_a_prefill_registered_as_mixed_fails(etcd: Etcd) -> None:
    mixed = worker("10.0.0.11", 8001, prefill_ktc("kv_both"))
    r = Registrar(etcd.endpoint, worker_key(None, mixed.id), lambda: build_record(mixed), ttl=5).start()
    try:
        assert r.registered.wait(10)
        put(etcd, DECODE)
        res = doctor(etcd.endpoint)
    finally:
        r.stop()
    assert res.status is Status.FAIL
    assert "10.0.0.11:8001 looks like a prefill leg" in res.summary
    assert "registered as mixed (top-level kv_role kv_both)" in res.summary
    assert "no prefill worker" not in res.summary, "the decode leg's partner is the mis-set prefill"
    assert res.fix and '"kv_role":"kv_producer"' in res.fix
    assert any(d.startswith("mixed org/m at http://10.0.0.11:8001") for d in res.details)


def test_absent_top_level_role_is_the_same_trap(etcd: Etcd) -> None:
    put(etcd, worker("10.0.0.11", 8001, prefill_ktc(None)), DECODE)
    res = doctor(etcd.endpoint)
    assert res.status is Status.FAIL and "top-level kv_role absent" in res.summary


def test_a_healthy_pair_is_ok_and_listed(etcd: Etcd) -> None:
    put(etcd, PREFILL, DECODE)
    res = doctor(etcd.endpoint)
    assert res.status is Status.OK, res.summary
    assert res.summary == (
        f"2 workers in etcd at {etcd.endpoint} (1 prefill, 1 decode; model org/m): "
        "prefill 10.0.0.11:8001, decode 10.0.0.12:8002"
    )
    text = " ".join(e.value for e in res.evidence)
    assert "kvd yes" in text and "kvd no" in text and "PYTHONHASHSEED=0" in text


def test_different_hash_settings_fail(etcd: Etcd) -> None:
    unset = HashInfo(None, "0.32.0", "sha256", 16, "fixed", "fp1")
    put(etcd, PREFILL, worker("10.0.0.12", 8002, MC_D, unset))
    res = doctor(etcd.endpoint)
    assert res.status is Status.FAIL
    assert "workers of org/m hash blocks differently" in res.summary
    assert (
        "sha256/env:0/16: 10.0.0.11:8001" in res.summary and "sha256/fixed/16: 10.0.0.12:8002" in res.summary
    )


def test_only_a_different_vllm_version_warns(etcd: Etcd) -> None:
    put(etcd, PREFILL, worker("10.0.0.12", 8002, MC_D, HashInfo("0", "0.33.1", "sha256", 16, "env:0", "fp0")))
    res = doctor(etcd.endpoint)
    assert res.status is Status.WARN and "different vLLM versions (0.32: 10.0.0.11:8001; 0.33:" in res.summary


def test_a_random_seed_fails(etcd: Etcd) -> None:
    rnd = HashInfo(None, "0.28.0", "sha256", 16, "random", "random-abc")
    put(etcd, worker("10.0.0.11", 8001, prefill_ktc(), rnd), DECODE)
    res = doctor(etcd.endpoint)
    assert res.status is Status.FAIL and "seeds its block hashes randomly" in res.summary


def test_a_decode_leg_with_a_kvd_child_fails(etcd: Etcd) -> None:
    bad = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"connectors": [KVD, MC_D]},
    }
    put(etcd, PREFILL, worker("10.0.0.12", 8002, bad))
    res = doctor(etcd.endpoint)
    assert res.status is Status.FAIL and "decode worker 10.0.0.12:8002 carries a kvd connector" in res.summary
    assert res.fix and "KVD204" in res.fix


@pytest.mark.parametrize(("leg", "missing"), [(PREFILL, "no decode"), (DECODE, "no prefill")])
def test_one_leg_alone_warns(etcd: Etcd, leg: WorkerInfo, missing: str) -> None:
    put(etcd, leg)
    res = doctor(etcd.endpoint)
    assert res.status is Status.WARN and f"{missing} worker registered" in res.summary


def test_models_are_paired_separately(etcd: Etcd) -> None:
    put(etcd, PREFILL, DECODE, worker("10.0.0.13", 8001, prefill_ktc(), model="org/other"))
    res = doctor(etcd.endpoint)
    assert (
        res.status is Status.WARN
        and res.summary == "org/other has prefill workers but no decode worker registered"
    )


def test_transports_that_disagree_warn(etcd: Etcd) -> None:
    d = WorkerInfo("10.0.0.12", 8002, "org/m", MC_D, HASH, request_transport="http", kv_event_transport=None)
    put(etcd, PREFILL, d)
    res = doctor(etcd.endpoint)
    assert res.status is Status.WARN and "disagree on request/KV-event transports" in res.summary


def test_empty_registry_and_other_prefix(etcd: Etcd) -> None:
    res = doctor(etcd.endpoint)
    assert res.status is Status.WARN and "no worker registered under /infera-kvd/v1/workers/" in res.summary
    with EtcdClient(etcd.endpoint) as c:
        c.put("/pd/prod/10.0.0.11:8001", json.dumps(build_record(PREFILL)))
        c.put("/pd/prod/garbage", "not json")
    res = doctor(etcd.endpoint, prefix="pd/prod")
    assert res.status is Status.WARN
    assert "1 keys under /pd/prod/ are not worker records" in res.summary
    assert "no decode worker" in res.summary


def test_without_etcd_it_skips_and_unreachable_fails() -> None:
    assert doctor(None).status is Status.SKIP
    dead = f"127.0.0.1:{free_port()}"
    res = doctor(dead)
    assert res.status is Status.FAIL and f"cannot read etcd at {dead}" in res.summary and res.fix


def test_cli_json_and_exit_status(etcd: Etcd) -> None:
    put(etcd, worker("10.0.0.11", 8001, prefill_ktc("kv_both")), DECODE)
    cmd = [str(KVD_BIN), "doctor", "--etcd", etcd.endpoint, "--check", "pd", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    data = json.loads(proc.stdout)
    assert proc.returncode == 1
    (c,) = data["checks"]
    assert (c["id"], c["area"], c["status"]) == ("pd-workers", "pd", "fail")
    assert {e["kind"] for e in c["evidence"]} == {"etcd"}
    bad = subprocess.run([str(KVD_BIN), "doctor", "--etcd", "no such:host"], capture_output=True, text=True)
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr
