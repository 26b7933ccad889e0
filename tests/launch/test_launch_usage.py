"""`kvd launch single|pd` refuses, at option time and in one line, what the engine, the daemon or a
rule would refuse later; options that contradict each other; and the parser's own mistakes."""

from __future__ import annotations

import json

import pytest
from launchkit import kvd, launch_json

PD = ["pd", "--model", "m", "--etcd", "e:2379", "--advertise-host", "10.0.0.5"]
SINGLE = ["single", "--model", "m"]


def one_line_usage_error(args: list[str]) -> str:
    """Run ``kvd launch ARGS``; assert exit 2 with one ``error:`` line (and at most a ``hint:``)."""
    res = kvd("launch", *args)
    assert res.code == 2, (res.code, res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), res.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), res.stderr
    assert res.stdout == "" and "Traceback" not in res.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # values the engine, the daemon or kvd lint refuse
        ([*PD, "--discovery-backend", "bogus"], "--discovery-backend 'bogus' is not supported"),
        ([*PD, "--request-transport", "two words"], "--request-transport: 'two words' is not a name"),
        ([*PD, "--kv-event-transport", ""], "--kv-event-transport is empty"),
        ([*PD[:4], "e:99999", *PD[5:]], "--etcd: 99999 is not a TCP port"),
        ([*PD[:4], "e:0", *PD[5:]], "--etcd: 0 is not a TCP port"),
        ([*PD[:-1], "bad host"], "--advertise-host: 'bad host' is not a host name or an IP address"),
        ([*PD, "--decode-advertise-host", "a/b"], "--decode-advertise-host: 'a/b' is not a host name"),
        ([*SINGLE, "--host", "bad host"], "--host: 'bad host' is not a host name or an IP address"),
        ([*SINGLE, "--vllm-version", "banana"], "--vllm-version: 'banana' is not a version like 0.32"),
        # a rule error (KVD301) refused with the rule's reasoning
        ([*PD, "--hash-seed", "none", "--vllm-version", "0.26"], "--hash-seed none: vLLM 0.26 draws a random seed"),
        (
            [*SINGLE, "--hash-seed", "none", "--engine-arg=--prefix-caching-hash-algo=xxhash"],
            "--hash-seed none: hash algorithm xxhash draws a random seed",
        ),
        # --daemon-arg: the flags launch writes, unknown flags, stray words, bad values (KVD402/KVD502 before)
        (
            [*SINGLE, "--max-bytes", "2G", "--daemon-arg=--max-bytes=5G"],
            "--daemon-arg --max-bytes: kvd launch sets this flag itself; use its own option --max-bytes",
        ),
        ([*SINGLE, "--daemon-arg=--max-bytes=5G"], "--daemon-arg --max-bytes: kvd launch sets this flag itself"),
        ([*SINGLE, "--daemon-arg=--socket=/other.sock"], "--daemon-arg --socket: kvd launch sets this flag itself"),
        (
            [*SINGLE, "--metrics-port", "9400", "--daemon-arg=--metrics-port=9500"],
            "--daemon-arg --metrics-port: kvd launch sets this flag itself",
        ),
        ([*SINGLE, "--daemon-arg=--bogus"], "--daemon-arg --bogus: the daemon has no such flag"),
        ([*SINGLE, "--daemon-arg=stray"], "--daemon-arg 'stray': not a daemon flag"),
        ([*SINGLE, "--daemon-arg=--metrics-port=x"], "--metrics-port: x is not a TCP port"),
        ([*SINGLE, "--daemon-arg=--long-bytes=1T"], "--long-bytes needs --long-path"),
        ([*SINGLE, "--engine-arg=--no-enable-prefix-caching"], "--engine-arg --no-enable-prefix-caching: kvd"),
        # ports two listeners of one host would share
        ([*PD, "--prefill-port", "8001", "--decode-port", "8001"], "--decode-port: 8001 is taken by the prefill leg"),
        ([*PD, "--decode-port", "8998"], "--decode-port: 8998 is taken by the prefill leg's Mooncake bootstrap"),
        ([*PD, "--metrics-port", "8001"], "--prefill-port: 8001 is taken by the daemon's --metrics-port"),
        ([*SINGLE, "--port", "9400", "--metrics-port", "9400"], "--port: 9400 is taken by the daemon's"),
        # contradictions
        ([*SINGLE, "--json", "--format", "systemd"], "--json is --format json, but --format systemd is given"),
        ([*SINGLE, "--part", "engine"], "--part picks what --run starts"),
        ([*SINGLE, "--force"], "--force lets --out and --save-spec replace files"),
        ([*PD, "--no-router", "--router-port", "9000"], "--router-port is the router's port, but --no-router"),
        # empty values
        (["single", "--model", ""], "--model is empty"),
        (["pd", "--model", "m", "--etcd", " ", "--advertise-host", "10.0.0.5"], "--etcd is empty"),
        ([*SINGLE, "--out", ""], "--out is empty"),
        ([*SINGLE, "--save-spec", ""], "--save-spec is empty"),
        ([*SINGLE, "--save-spec", "spec.txt"], "--save-spec: spec.txt does not end in .yaml, .yml or .json"),
        # the command-line parser's own mistakes
        ([*SINGLE, "--port", "abc"], "--port: 'abc' is not a whole number"),
        ([*PD, "--prefill-port", "x"], "--prefill-port: 'x' is not a whole number"),
        ([*SINGLE, "--prot", "1"], "no such option: --prot"),
        (["single", "--model"], "option '--model' requires an argument"),
        ([*SINGLE, "stray"], "got unexpected extra argument(s) (stray)"),
        (["--bogus"], "no such option: --bogus"),
        (["nosuchkind"], "no such command 'nosuchkind'"),
    ],
)  # fmt: skip
def test_refused_in_one_line(args: list[str], message: str) -> None:
    first = one_line_usage_error(args)
    assert message in first, first


def test_lint_option_mistakes_are_one_line_too() -> None:
    res = kvd("lint", "--format", "text", "--bogus", "x.sh")
    assert res.code == 2 and res.stderr.splitlines()[0] == "error: no such option: --bogus", res.stderr
    assert "╭" not in res.stderr


def test_launch_alone_still_prints_its_help() -> None:
    res = kvd("launch")  # Typer's no-arguments help, as before (its exit status stays Typer's)
    assert "Usage: kvd launch" in res.stdout and "single" in res.stdout and "error:" not in res.stderr


def test_what_is_accepted_is_written() -> None:
    spec = launch_json(*PD, "--discovery-backend", "etcd", "--request-transport", "grpc", "--vllm-version", "0.32",
                       "--hash-seed", "none", "--daemon-arg=--metrics-port=9400", "--advertise-host", "fe80::5",
                       "--decode-advertise-host", "decode-1.example.internal", "--etcd", "[fd00::1]:2379")  # fmt: skip
    assert spec["daemon"]["argv"][-1] == "--metrics-port=9400"
    prefill, decode = spec["legs"]
    assert "PYTHONHASHSEED" not in prefill["env"] and spec["vllm_version"] == "0.32"
    argv = decode["argv"]
    assert argv[argv.index("--advertise-host") + 1] == "decode-1.example.internal"
    assert argv[argv.index("--etcd-endpoint") + 1] == "[fd00::1]:2379"
    # the two legs on separate hosts may share a port, and the router may take a leg's port there
    res = kvd(
        "launch", *PD, "--decode-advertise-host", "10.0.0.6", "--decode-port", "8001", "--router-port", "8001"
    )
    assert res.code == 0, res.stderr


def test_options_alone_never_break_a_rule() -> None:
    """docs/launch.md: options produce usage errors, and warnings at most from the rules."""
    for args in (
        [*SINGLE, "--engine-arg=--enable-prefix-caching"],
        [*PD, "--hash-seed", "none"],  # a KVD301 warning: the vLLM version is unknown
        [*PD, "--router-port", "8001"],
    ):
        res = kvd("launch", *args, "--json")
        assert res.code != 1 and "[error]" not in res.stderr, (args, res.stderr)
        if res.code == 0:
            json.loads(res.stdout)
