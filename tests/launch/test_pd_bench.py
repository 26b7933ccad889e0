"""benchmarks/pdkit.py: benchmarks/pd.py's pieces that need no engine: the address the legs advertise, the changed
kv-transfer-configs of its phases, the router command per transport, and the metrics it reads."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers import benchmark_script, free_port


@pytest.fixture(scope="module")
def pd() -> Any:
    return benchmark_script("pdkit")


PREFILL_KTC = {
    "kv_connector": "MultiConnector",
    "kv_role": "kv_producer",
    "kv_connector_extra_config": {
        "connectors": [
            {
                "kv_connector": "InferaKvdConnector",
                "kv_role": "kv_both",
                "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
            },
            {
                "kv_connector": "MooncakeConnector",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
            },
        ]
    },
}


def leg_argv(cfg: dict[str, Any]) -> list[str]:
    return ["python3", "-m", "infera.engine.vllm", "--port", "8001", "--kv-transfer-config", json.dumps(cfg)]


def test_routable_ip_without_a_default_route(pd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An isolated GPU machine has interfaces but no route to 10.255.255.255: connecting the UDP
    socket fails there (ENETUNREACH), and the address comes from the interfaces instead."""

    class NoRoute(socket.socket):
        def connect(self, address: Any) -> None:
            raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(pd.socket, "socket", NoRoute)
    monkeypatch.setattr(pd, "interface_ips", lambda: ["10.1.2.3", "127.0.0.1"])
    assert pd.routable_ip() == "10.1.2.3"
    monkeypatch.setattr(pd, "interface_ips", lambda: ["127.0.0.1"])
    with pytest.raises(pd.PdError, match="--advertise-host"):
        pd.routable_ip()


def test_interface_ips_lists_loopback_last(pd: Any) -> None:
    ips = pd.interface_ips()
    assert "127.0.0.1" in ips
    assert ips[-1].startswith("127.")


def test_phase_configs(pd: Any) -> None:
    argv = leg_argv(PREFILL_KTC)
    mixed = json.loads(pd.top_level_both(argv)[-1])
    assert mixed["kv_role"] == "kv_both"
    assert mixed["kv_connector_extra_config"] == PREFILL_KTC["kv_connector_extra_config"]
    alone = json.loads(pd.without_kvd(argv)[-1])
    assert alone == {
        "kv_connector": "MooncakeConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
    }
    example = json.loads(pd.to_example(argv, "kv_producer", "/tmp/h")[-1])
    assert example["kv_connector_extra_config"]["connectors"][1] == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/h"},
    }
    assert pd.top_level_both(argv)[:-1] == argv[:-1]


def test_router_argv_per_transport(pd: Any) -> None:
    argv = ["python3", "-m", "vllm_router.launch_router", "--host", "0.0.0.0", "--port", "8000"]
    argv += ["--vllm-pd-disaggregation", "--kv-connector", "mooncake"]
    argv += ["--prefill", "http://10.0.0.11:8001", "8998", "--decode", "http://10.0.0.11:8002"]
    assert pd.router_argv(argv, "mooncake") == argv
    example = pd.router_argv(argv, "example")
    assert "--kv-connector" not in example and "8998" not in example
    assert example[-4:] == ["--prefill", "http://10.0.0.11:8001", "--decode", "http://10.0.0.11:8002"]


def test_parse_metrics_sums_labels_and_keeps_sources(pd: Any) -> None:
    text = "\n".join(
        [
            "# HELP vllm:external_prefix_cache_hits_total External prefix cache hits",
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="bench"} 7168.0',
            'vllm:external_prefix_cache_hits_total{engine="1",model_name="bench"} 1024.0',
            'vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 17.0',
            'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 9200.0',
            'vllm:prompt_tokens_created{engine="0"} 1.7e9',
        ]
    )
    got = pd.parse_metrics(text)
    assert got["vllm:external_prefix_cache_hits_total"] == 8192.0
    assert got["vllm:prompt_tokens_by_source_total"] == 9217.0
    assert got['vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}'] == 9200.0
    assert "vllm:prompt_tokens_created" not in got


def test_start_etcd_serves_the_loopback_endpoint_and_refuses_others(pd: Any, tmp_path: Path) -> None:
    etcd_bin = shutil.which("etcd")
    if etcd_bin is None:
        pytest.skip("etcd is not installed (scripts/setup.sh --all)")
    port = free_port()
    etcd = pd.start_etcd(etcd_bin, f"127.0.0.1:{port}", tmp_path)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert b'"true"' in r.read()
    finally:
        etcd.stop()
    with pytest.raises(pd.PdError, match="loopback"):
        pd.start_etcd(etcd_bin, "10.0.0.5:2379", tmp_path)
