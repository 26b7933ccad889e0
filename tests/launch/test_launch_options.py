"""`kvd launch single|pd` options: what they produce, and one-line errors naming the flag."""

from __future__ import annotations

import json

import pytest
from launchkit import kvd, launch_json

PD = ["pd", "--model", "m", "--etcd", "etcd:2379", "--advertise-host", "10.0.0.5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["single"], "--model is required"),
        (["pd", "--model", "m", "--advertise-host", "10.0.0.5"], "--etcd is required"),
        (["pd", "--model", "m", "--etcd", "e:2379"], "--advertise-host is required"),
        ([*PD[:-1], "127.0.0.1"], "--advertise-host: 127.0.0.1 is not routable"),
        (
            ["pd", "--model", "m", "--etcd", "etcd", "--advertise-host", "10.0.0.5"],
            "--etcd: 'etcd' is not HOST:PORT",
        ),
        (["single", "--model", "m", "--long-path", "/nvme/x"], "--long-path needs --long-bytes"),
        (["single", "--model", "m", "--long-bytes", "1T"], "--long-bytes needs --long-path"),
        (
            ["single", "--model", "m", "--long-path", "rel/dir", "--long-bytes", "1T"],
            "--long-path: 'rel/dir' is not an absolute path",
        ),
        (["single", "--model", "m", "--max-bytes", "lots"], "--max-bytes: 'lots' is not a size"),
        (["single", "--model", "m", "--long-backend", "s3"], "--long-backend: 's3' is not one of"),
        (
            ["single", "--model", "m", "--long-backend", "mooncake"],
            "--long-backend mooncake needs --mooncake-master",
        ),
        (
            [
                "single",
                "--model",
                "m",
                "--long-backend",
                "mooncake",
                "--mooncake-master",
                "m:1",
                "--long-path",
                "/x",
                "--long-bytes",
                "1G",
            ],
            "the long tier is disk or distributed, never both",
        ),
        (
            ["single", "--model", "m", "--mooncake-master", "m:1"],
            "--mooncake-master needs --long-backend mooncake",
        ),
        (["single", "--model", "m", "--ais"], "--ais needs --long-path"),
        (
            ["single", "--model", "m", "--long-backend", "lmcache"],
            "--long-backend lmcache needs --lmcache-url",
        ),
        (
            ["single", "--model", "m", "--lmcache-url", "lm://h:1"],
            "--lmcache-url needs --long-backend lmcache",
        ),
        (["single", "--model", "m", "--hipfile-root", "x=/y"], "--hipfile-root needs --ais"),
        (["single", "--model", "m", "--port", "70000"], "--port: 70000 is not a TCP port"),
        (["single", "--model", "m", "--socket", "kvd.sock"], "--socket: 'kvd.sock' is not an absolute path"),
        (["single", "--model", "m", "--hash-seed", "abc"], "--hash-seed: 'abc'"),
        (
            ["single", "--model", "m", "--engine-arg=--port=1"],
            "--engine-arg --port: kvd launch sets this flag itself",
        ),
        (["single", "--model", "m", "--format", "helm"], "--format: 'helm' is not one of"),
        (["single", "--model", "m", "--format", "k8s"], "--image is required for --format k8s"),
        (["single", "--model", "m", "--format", "env", "--run"], "--run runs the shell format"),
    ],
)
def test_bad_options_are_one_line_errors_naming_the_flag(args: list[str], message: str) -> None:
    res = kvd("launch", *args)
    assert res.code == 2, res.stdout + res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith("error: ") and message in first, res.stderr
    assert res.stdout == "" and "Traceback" not in res.stderr


def test_single_options_reach_the_commands() -> None:
    spec = launch_json(
        "single", "--model", "org/m", "--socket", "/run/k.sock", "--max-bytes", "8G", "--long-path", "/nvme/l",
        "--long-bytes", "1T", "--ais", "--hipfile-root", "scratch=/scratch", "--host", "127.0.0.1", "--port", "9000",
        "--hash-seed", "42", "--prewarm", "--engine-arg=--max-model-len=4096", "--daemon-arg=--metrics-port=9400",
        "--python", "/opt/venv/bin/python",
    )  # fmt: skip
    assert spec["daemon"]["argv"] == [
        "/opt/venv/bin/python", "-m", "infera.kvd", "--socket", "/run/k.sock", "--max-bytes", "8G",
        "--long-path", "/nvme/l", "--long-bytes", "1T", "--metrics-port=9400",
    ]  # fmt: skip
    (leg,) = spec["legs"]
    assert leg["env"] == {
        "PYTHONHASHSEED": "42",
        "INFERA_KVD_SOCKET": "/run/k.sock",
        "INFERA_KVD_AIS": "1",
        "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/l,scratch=/scratch",
    }
    argv = leg["argv"]
    assert argv[:11] == [
        "/opt/venv/bin/python", "-m", "infera.engine.vllm", "--model", "org/m", "--port", "9000", "--host",
        "127.0.0.1", "--kvd-socket-path", "/run/k.sock",
    ]  # fmt: skip
    assert "--max-model-len=4096" in argv and "--enable-prefix-caching" in argv


def test_pd_options_reach_both_legs() -> None:
    spec = launch_json(
        *PD, "--decode-advertise-host", "10.0.0.6", "--prefill-port", "7001", "--decode-port", "7002",
        "--request-transport", "grpc", "--kv-event-transport", "ipc", "--hash-seed", "none",
    )  # fmt: skip
    prefill, decode = spec["legs"]
    assert (prefill["role"], decode["role"]) == ("prefill", "decode")
    assert prefill["env"]["VLLM_HOST_IP"] == "10.0.0.5" and decode["env"] == {"VLLM_HOST_IP": "10.0.0.6"}
    for leg, port in ((prefill, "7001"), (decode, "7002")):
        a = leg["argv"]
        assert a[a.index("--port") + 1] == port
        assert (
            a[a.index("--request-transport") + 1] == "grpc"
            and a[a.index("--kv-event-transport") + 1] == "ipc"
        )
    assert prefill["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert decode["kv_transfer_config"] == {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}


def test_mooncake_long_tier_flags() -> None:
    spec = launch_json("single", "--model", "m", "--long-backend", "mooncake", "--mooncake-master", "10.0.0.9:50051",
                       "--mooncake-metadata", "http://10.0.0.9:8080/metadata", "--mooncake-protocol", "rdma",
                       "--mooncake-device", "mlx5_0")  # fmt: skip
    assert spec["daemon"]["argv"][7:] == [
        "--long-backend", "mooncake", "--mooncake-master", "10.0.0.9:50051", "--mooncake-metadata",
        "http://10.0.0.9:8080/metadata", "--mooncake-protocol", "rdma", "--mooncake-device", "mlx5_0",
    ]  # fmt: skip
    assert spec["daemon"]["long_backend"] == "mooncake"


def test_out_writes_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = kvd("launch", *PD, "--format", "systemd", "--out", str(tmp_path / "units"))
    assert res.code == 0 and res.stdout == ""
    names = sorted(p.name for p in (tmp_path / "units").iterdir())
    assert names == [
        "infera-decode.service",
        "infera-kvd.service",
        "infera-prefill.service",
        "infera-router.service",
    ]
    res = kvd("launch", *PD, "--out", str(tmp_path / "sh"), "--emit")
    sh = tmp_path / "sh" / "launch.sh"
    assert sh.stat().st_mode & 0o111 and res.stdout == sh.read_text()


def test_json_flag_equals_format_json() -> None:
    assert kvd("launch", *PD, "--json").stdout == kvd("launch", *PD, "--format", "json").stdout
    json.loads(kvd("launch", *PD, "--json").stdout)


def test_every_missing_required_flag_in_one_error() -> None:
    res = kvd("launch", "pd")
    assert res.code == 2 and res.stdout == ""
    first = res.stderr.splitlines()[0]
    assert first.startswith("error: 3 required options are missing: --model (")
    assert "--etcd (" in first and "--advertise-host (" in first
    assert "hint: kvd launch pd --model ... --etcd ... --advertise-host ..." in res.stderr
    res = kvd("launch", "pd", "--etcd", "e:2379")
    assert "2 required options are missing: --model (" in res.stderr and "--etcd (" not in res.stderr


def test_the_interpreter_defaults_to_this_kvds_python_or_the_images_python3() -> None:
    import sys

    host = launch_json("single", "--model", "m")
    assert host["python"] == sys.executable and sys.executable.startswith("/")
    assert {host["daemon"]["argv"][0], host["legs"][0]["argv"][0]} == {sys.executable}
    image = launch_json("single", "--model", "m", "--image", "img:1")
    assert image["python"] == "python3"
    assert {image["daemon"]["argv"][0], image["legs"][0]["argv"][0]} == {"python3"}


def test_systemd_format_warns_about_a_relative_interpreter() -> None:
    res = kvd("launch", "single", "--model", "m", "--python", "python3", "--format", "systemd")
    assert res.code == 0
    assert "warning: kvd: ExecStart runs 'python3', which systemd looks up in its own PATH" in res.stderr
    assert "warning" not in kvd("launch", "single", "--model", "m", "--format", "systemd").stderr


@pytest.mark.parametrize("fmt", ["shell", "json", "env", "systemd", "k8s", "compose"])
def test_every_file_ends_in_a_newline(tmp_path, fmt: str) -> None:  # type: ignore[no-untyped-def]
    for kind in (["single", "--model", "m"], PD):
        out = tmp_path / fmt / kind[0]
        assert kvd("launch", *kind, "--image", "img:1", "--format", fmt, "--out", str(out)).code == 0
        for f in out.iterdir():
            assert f.read_text().endswith("\n") and not f.read_text().endswith("\n\n"), f.name
