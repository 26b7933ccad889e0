"""The entry point's P/D flags (``infera.engine.vllm.api.discovery``) without vLLM: validation, the
advertised address, and the record built from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from infera.discovery.record import build_record
from infera.engine.vllm.api import discovery
from infera.errors import UsageError

PREFILL_KTC = json.dumps(
    {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "InferaKvdConnector", "kv_role": "kv_both"},
                {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
            ]
        },
    }
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="org/m")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--kv-transfer-config", default=None)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--kvd-socket-path", default=None)
    discovery.add_arguments(parser.add_argument_group("infera-kvd"))
    return parser.parse_args(list(argv))


def test_no_discovery_flags_means_no_plan() -> None:
    assert discovery.plan(parse(), {}) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--discovery-backend", "etcd"], "needs --etcd-endpoint"),
        (["--discovery-backend", "consul", "--etcd-endpoint", "e:2379"], "'consul' is not supported"),
        (["--etcd-endpoint", "not a host"], "is not HOST:PORT"),
        (["--etcd-endpoint", "e:2379", "--discovery-lease-ttl", "1"], "at least 2 s"),
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as exc:
        discovery.plan(parse(*argv), {})
    assert message in exc.value.message


@pytest.mark.parametrize(
    ("argv", "env", "host", "source"),
    [
        (
            ["--advertise-host", "10.0.0.11", "--host", "10.0.0.9"],
            {"VLLM_HOST_IP": "10.0.0.8"},
            "10.0.0.11",
            "--advertise-host",
        ),
        (["--host", "10.0.0.9"], {"VLLM_HOST_IP": "10.0.0.8"}, "10.0.0.8", "VLLM_HOST_IP"),
        (["--host", "10.0.0.9"], {}, "10.0.0.9", "--host"),
    ],
)
def test_advertised_address_precedence(argv: list[str], env: dict[str, str], host: str, source: str) -> None:
    p = discovery.plan(parse("--etcd-endpoint", "e:2379", "--port", "8001", *argv), env)
    assert p is not None and (p.host, p.host_source) == (host, source)
    assert p.key == f"/infera-kvd/v1/workers/{host}:8001"


def test_wildcard_host_falls_back_to_the_host_name() -> None:
    p = discovery.plan(parse("--etcd-endpoint", "e:2379", "--host", "0.0.0.0"), {})
    assert p is not None and p.host_source == "the host name" and p.host not in ("0.0.0.0", "")


def test_ipv6_and_prefix_in_the_key() -> None:
    args = parse("--etcd-endpoint", "e", "--advertise-host", "fd00::5", "--discovery-prefix", "pd/prod")
    p = discovery.plan(args, {})
    assert p is not None and p.key == "/pd/prod/[fd00::5]:8000"


def test_record_from_the_command_line(monkeypatch: Any) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("INFERA_KVD_SOCKET", "/run/kvd.sock")
    args = parse(
        "--etcd-endpoint", "e:2379", "--advertise-host", "10.0.0.11", "--port", "8001",
        "--kv-transfer-config", PREFILL_KTC, "--served-model-name", "m8b",
        "--request-transport", "http", "--kv-event-transport", "zmq",
    )  # fmt: skip
    p = discovery.plan(args, {})
    assert p is not None
    rec = build_record(discovery.worker_info(args, p, None))
    assert (rec["role"], rec["kv_role"], rec["kvd"]) == ("prefill", "kv_producer", True)
    assert rec["kvd_socket"] == "/run/kvd.sock"
    assert rec["served_model_names"] == ["m8b"] and rec["model"] == "org/m"
    assert (rec["request_transport"], rec["kv_event_transport"]) == ("http", "zmq")
    assert rec["hash"]["python_hash_seed"] == "0" and rec["hash"]["seed"] == "env:0"
    assert rec["hash"]["block_size"] is None and rec["hash"]["fingerprint"] is None, (
        "unknown without the engine"
    )
    assert rec["advertise_host_from"] == "--advertise-host"


def test_decode_leg_has_no_kvd_socket(monkeypatch: Any) -> None:
    monkeypatch.setenv("INFERA_KVD_SOCKET", "/run/kvd.sock")
    ktc = '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}'
    args = parse("--etcd-endpoint", "e", "--advertise-host", "h", "--kv-transfer-config", ktc)
    p = discovery.plan(args, {})
    assert p is not None
    rec = build_record(discovery.worker_info(args, p, None))
    assert (rec["role"], rec["kvd"], rec["kvd_socket"]) == ("decode", False, None)


def test_start_exits_2_on_bad_flags(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        discovery.start(parse("--discovery-backend", "etcd"), None)
    assert exc.value.code == 2
    assert "infera-kvd: error: --discovery-backend etcd needs --etcd-endpoint" in capsys.readouterr().err


def test_start_says_when_pd_flags_do_nothing(capsys: Any) -> None:
    assert (
        discovery.start(parse("--advertise-host", "10.0.0.11", "--request-transport", "http"), None) is None
    )
    err = capsys.readouterr().err
    assert (
        "--advertise-host --request-transport are for the P/D registration, which needs --etcd-endpoint"
        in err
    )
