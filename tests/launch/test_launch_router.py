"""The vllm-router `kvd launch pd` writes: its command in every format, and `kvd lint`'s router rules
(KVD210-KVD213), each broken variant rendered in every format and read back by lint's front ends.

The real tools that read each format (systemd-analyze verify, the Kubernetes schemas, docker-compose,
shellcheck) check the router too: it is part of every P/D variant of test_launch_validators.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from launchkit import kvd

from infera.launch.lint import Source, lint_sources
from infera.launch.model import KTC_FLAG, Deployment, Leg, ktc_json
from infera.launch.render import render
from infera.launch.spec import from_data

FORMATS = ("shell", "systemd", "k8s", "compose", "json")
EXT = {"shell": "sh", "systemd": "txt", "k8s": "yaml", "compose": "yaml", "json": "json"}
P_HOST, D_HOST = "10.0.0.11", "10.0.0.12"


def deployment(*args: str) -> Deployment:
    """What `kvd launch pd ... [args]` builds (through its JSON spec)."""
    res = kvd(
        "launch", "pd", "--model", "m", "--etcd", "etcd:2379", "--advertise-host", P_HOST,
        "--decode-advertise-host", D_HOST, "--python", "/usr/bin/python3", "--image", "img:1",
        *args, "--format", "json",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    return from_data(json.loads(res.stdout), "deployment.json")


def lint(dep: Deployment, fmt: str) -> list[tuple[str, str]]:
    """(code, message) of every finding in ``dep`` rendered as ``fmt`` and read back by lint."""
    files = render(dep, fmt)
    sources = [Source(name, text) for name, text in files.items()]
    res = lint_sources(sources, together=True)
    return [(f.code, f.message) for f in res.findings]


def router_argv(dep: Deployment) -> list[str]:
    assert len(dep.routers) == 1
    argv = dep.routers[0].argv
    assert argv is not None
    return argv


def drop(words: list[str]) -> Callable[[Deployment], None]:
    def edit(dep: Deployment) -> None:
        argv = router_argv(dep)
        i = argv.index(words[0])
        assert argv[i : i + len(words)] == words
        del argv[i : i + len(words)]

    return edit


def replace(old: str, new: str) -> Callable[[Deployment], None]:
    def edit(dep: Deployment) -> None:
        argv = router_argv(dep)
        argv[argv.index(old)] = new

    return edit


def swap_workers(dep: Deployment) -> None:
    argv = router_argv(dep)
    p, d = argv.index("--prefill"), argv.index("--decode")
    argv[p + 1], argv[d + 1] = argv[d + 1], argv[p + 1]


def top_role(leg_name: str, role: str) -> Callable[[Deployment], None]:
    def edit(dep: Deployment) -> None:
        leg: Leg = next(leg for leg in dep.legs if leg.name == leg_name)
        argv = leg.argv
        assert argv is not None
        cfg = leg.ktc()
        assert cfg is not None
        cfg["kv_role"] = role
        argv[argv.index(KTC_FLAG) + 1] = ktc_json(cfg)

    return edit


def bootstrap_env(dep: Deployment) -> None:
    dep.legs[0].env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = "9100"


BROKEN: dict[str, tuple[Callable[[Deployment], None], str, str]] = {
    "no-pd-switch": (drop(["--vllm-pd-disaggregation"]), "KVD210", "has no --vllm-pd-disaggregation"),
    "no-connector": (drop(["--kv-connector", "mooncake"]), "KVD211", "--kv-connector nixl (the router's default)"),
    "nixl-connector": (replace("mooncake", "nixl"), "KVD211", "pass --kv-connector mooncake"),
    "prefill-wrong-port": (
        replace(f"http://{P_HOST}:8001", f"http://{P_HOST}:8003"),
        "KVD212",
        f"--prefill http://{P_HOST}:8003 is no leg of this deployment",
    ),
    "swapped": (swap_workers, "KVD212", f"--prefill http://{D_HOST}:8002 is the decode leg"),
    "prefill-kv-both": (top_role("prefill", "kv_both"), "KVD212", "whose top-level kv_role is 'kv_both'"),
    "decode-kv-both": (top_role("decode", "kv_both"), "KVD212", "not 'kv_consumer'"),
    "no-decode": (drop(["--decode", f"http://{D_HOST}:8002"]), "KVD212", "has no --decode worker"),
    "bootstrap-port": (replace("8998", "9000"), "KVD213", "bootstrap on port 9000, but leg"),
    "bootstrap-env": (bootstrap_env, "KVD213", "serves it on 9100"),
}  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_emitted_router_lints_clean_and_is_read_back(fmt: str) -> None:
    dep = deployment()
    assert lint(dep, fmt) == []
    files = render(dep, fmt)
    res = lint_sources([Source(n, t) for n, t in files.items()], together=True)
    assert res.files == len(files)
    assert router_argv(dep) == [
        "/usr/bin/python3", "-m", "vllm_router.launch_router", "--host", "0.0.0.0", "--port", "8000",
        "--vllm-pd-disaggregation", "--kv-connector", "mooncake",
        "--prefill", f"http://{P_HOST}:8001", "8998", "--decode", f"http://{D_HOST}:8002",
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", list(BROKEN))
def test_each_broken_router_is_caught_in_every_format(fmt: str, variant: str) -> None:
    edit, code, text = BROKEN[variant]
    dep = deployment()
    edit(dep)
    found = lint(dep, fmt)
    assert any(c == code and text in m for c, m in found), found


def test_router_flags_follow_the_legs() -> None:
    dep = deployment(
        "--router-port",
        "9000",
        "--prefill-port",
        "7001",
        "--decode-port",
        "7002",
        "--transfer-protocol",
        "tcp",
    )
    argv = router_argv(dep)
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--prefill") + 1 :][:2] == [f"http://{P_HOST}:7001", "8998"]
    assert argv[argv.index("--decode") + 1] == f"http://{D_HOST}:7002"
    for leg in dep.legs:
        mooncake = [c for c in leg.connectors() if c.name == "MooncakeConnector"]
        assert mooncake[0].raw["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}
    assert lint(dep, "shell") == []


def test_no_router_leaves_it_out_and_bad_values_are_one_line() -> None:
    base = ["launch", "pd", "--model", "m", "--etcd", "e:2379", "--advertise-host", P_HOST]
    res = kvd(*base, "--no-router", "--format", "json")
    assert res.code == 0 and "routers" not in json.loads(res.stdout)
    assert "vllm_router" not in kvd(*base, "--no-router").stdout
    for args, message in (
        (
            ["--router-port", "8001"],
            "error: --router-port: 8001 is taken by the prefill leg on the same host",
        ),
        (["--router-port", "70000"], "error: --router-port: 70000 is not a TCP port"),
        (["--transfer-protocol", "udp"], "error: --transfer-protocol: 'udp' is not tcp or rdma"),
    ):
        res = kvd(*base, *args)
        assert res.code == 2 and res.stderr.splitlines()[0] == message, res.stderr


def test_a_router_file_alone_checks_its_own_flags_only() -> None:
    """Linted without its legs, a router is checked for what it says itself, never against guesses."""
    text = "python -m vllm_router.launch_router --port 8000 --kv-connector mooncake --prefill http://a:1 --decode http://b:2\n"
    res = lint_sources([Source("router.sh", text)])
    assert [f.code for f in res.findings] == ["KVD210"]
    ok = text.replace("--port 8000", "--port 8000 --vllm-pd-disaggregation")
    assert lint_sources([Source("router.sh", ok)]).findings == []
    bare = "vllm-router --vllm-pd-disaggregation --kv-connector mooncake --prefill not-a-url:x --decode http://b:2\n"
    assert [f.code for f in lint_sources([Source("r.sh", bare)]).findings] == ["KVD212"]


def test_the_router_restarts_with_the_prefill_engine() -> None:
    """vllm-router reads the prefill engine's id once, at its start (docs/pd.md, on the H200: a
    router left running sent the decode leg to the old engine): systemd restarts it with the
    prefill unit, the other formats say to."""
    files = render(deployment(), "systemd")
    unit = files["infera-router.service"]
    assert "PartOf=infera-prefill.service\n" in unit
    assert "After=network-online.target infera-prefill.service infera-decode.service\n" in unit
    assert "PartOf=" not in files["infera-prefill.service"] + files["infera-decode.service"]
    (compose,) = render(deployment(), "compose").values()
    assert "docker compose restart router" in compose
    (k8s,) = render(deployment(), "k8s").values()
    assert "kubectl rollout restart deployment/infera-router" in k8s
    (shell,) = render(deployment(), "shell").values()
    assert "restart it after restarting the prefill engine" in shell
    # --no-router: nothing to restart, nothing said
    (compose,) = render(deployment("--no-router"), "compose").values()
    assert "restart" not in compose.split("services:")[0]
