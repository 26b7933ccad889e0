"""Spec files: saved by --save-spec, rendered by --spec, identical output; bad specs are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from launchkit import kvd

from infera.launch.render import FORMATS

PD = ["pd", "--model", "m", "--etcd", "etcd:2379", "--advertise-host", "10.0.0.5", "--long-path", "/nvme/kvd-long",
      "--long-bytes", "256G", "--ais", "--prewarm", "--image", "img:1", "--vllm-version", "0.32"]  # fmt: skip
SINGLE = ["single", "--model", "m", "--engine-arg=--max-model-len=8192", "--image", "img:1"]


@pytest.mark.parametrize("ext", ["yaml", "json"])
@pytest.mark.parametrize("args", [SINGLE, PD], ids=["single", "pd"])
def test_saved_spec_renders_the_same_in_every_format(tmp_path: Path, args: list[str], ext: str) -> None:
    spec = tmp_path / f"deploy.{ext}"
    res = kvd("launch", *args, "--save-spec", str(spec))
    assert res.code == 0 and res.stdout == "" and spec.exists()
    for fmt in FORMATS:
        direct = kvd("launch", *args, "--format", fmt)
        again = kvd("launch", "--spec", str(spec), "--format", fmt)
        assert again.code == 0, again.stderr
        assert again.stdout == direct.stdout, fmt


def test_spec_round_trips_through_save(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    kvd("launch", *PD, "--save-spec", str(first))
    kvd("launch", "--spec", str(first), "--save-spec", str(second))
    assert first.read_text() == second.read_text()
    data = yaml.safe_load(first.read_text())
    assert data["vllm_version"] == "0.32" and [leg["role"] for leg in data["legs"]] == ["prefill", "decode"]


def test_json_format_is_the_spec_shape() -> None:
    data = json.loads(kvd("launch", *PD, "--json").stdout)
    assert set(data) >= {"daemon", "legs"}
    for leg in data["legs"]:
        assert set(leg) == {"name", "role", "env", "argv", "kv_transfer_config"}
    assert data["daemon"]["socket"] == "/var/run/infera-kvd.sock" and data["daemon"]["argv"][:3] == [
        "python3",  # with --image: the image's python3 (without: the Python running kvd launch)
        "-m",
        "infera.kvd",
    ]


def test_hand_written_spec_with_fields_instead_of_flags(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "kind: single\n"
        "daemon: {socket: /run/kvd.sock, max_bytes: 8G}\n"
        "legs:\n"
        "  - name: engine\n"
        "    env: {PYTHONHASHSEED: 0, INFERA_KVD_SOCKET: /run/kvd.sock}\n"
        "    args: [--model, m, --enable-prefix-caching]\n"
        "    kv_transfer_config: {kv_connector: InferaKvdConnector, kv_role: kv_both,"
        " kv_connector_module_path: infera.engine.vllm.kvd_connector}\n"
    )
    out = json.loads(kvd("launch", "--spec", str(spec), "--json").stdout)
    assert out["daemon"]["argv"] == [
        "python",
        "-m",
        "infera.kvd",
        "--socket",
        "/run/kvd.sock",
        "--max-bytes",
        "8G",
    ]
    argv = out["legs"][0]["argv"]
    assert argv[:6] == ["python", "-m", "infera.engine.vllm", "--model", "m", "--enable-prefix-caching"]
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"] == "kv_both"
    assert out["legs"][0]["env"]["PYTHONHASHSEED"] == "0"


def test_spec_that_breaks_a_rule_is_refused_with_the_findings(tmp_path: Path) -> None:
    data = json.loads(kvd("launch", *PD, "--json").stdout)
    data["legs"][1]["env"].pop("PYTHONHASHSEED")
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(data))
    res = kvd("launch", "--spec", str(spec))
    assert res.code == 1 and res.stdout == ""
    assert "KVD301 [error]" in res.stderr and "error: the deployment breaks 1 rule(s)" in res.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("legs: [", "s.yaml:1: not valid YAML: expected the node content"),
        ("a: 1\n", "a spec is a mapping with a 'legs' list"),
        ("version: 7\nlegs: []\n", "spec version 7 is not supported"),
        ("legs:\n  - role: leader\n", "legs[0].role 'leader' is not one of single, prefill, decode"),
        ("legs:\n  - name: a\n  - name: a\n", "legs[1].name 'a' is used twice"),
        ("legs:\n  - name: 'a b'\n", "legs[0].name 'a b' is not a simple name"),
        (
            "daemon: {socket: /a, argv: [python, -m, infera.kvd, --socket, /b]}\nlegs: []\n",
            "daemon.socket is '/a'",
        ),
        (
            'legs:\n  - argv: [python, -m, infera.engine.vllm, --kv-transfer-config, \'{"kv_role":"kv_both"}\']\n'
            "    kv_transfer_config: {kv_role: kv_producer}\n",
            "legs[0].kv_transfer_config differs",
        ),
    ],
)
def test_bad_spec_is_a_one_line_usage_error(tmp_path: Path, text: str, needle: str) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    res = kvd("launch", "--spec", str(spec))
    assert res.code == 2
    assert res.stderr.startswith("error: ") and needle in res.stderr.splitlines()[0]
    assert "Traceback" not in res.stderr


def test_missing_spec_file() -> None:
    res = kvd("launch", "--spec", "/nonexistent/spec.yaml")
    assert res.code == 2 and "--spec: cannot read /nonexistent/spec.yaml" in res.stderr


def test_spec_with_a_subcommand_is_refused(tmp_path: Path) -> None:
    res = kvd("launch", "--spec", "x.yaml", "single", "--model", "m")
    assert res.code == 2 and "without single/pd" in res.stderr


def test_lint_reads_specs_with_positions(tmp_path: Path) -> None:
    data = json.loads(kvd("launch", *PD, "--json").stdout)
    prefill = data["legs"][0]
    prefill["kv_transfer_config"]["kv_role"] = "kv_both"
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    lines = spec.read_text().splitlines()
    res = kvd("lint", "--json", str(spec))
    (f,) = json.loads(res.stdout)["findings"]  # mirror and argv disagree: the spec itself is refused
    assert (f["code"], res.code) == ("KVD000", 1) and "differs" in f["message"]
    assert lines[f["line"] - 1].strip().startswith("kv_transfer_config:")

    idx = prefill["argv"].index("--kv-transfer-config") + 1
    prefill["argv"][idx] = json.dumps(prefill["kv_transfer_config"], separators=(",", ":"))
    spec.write_text(yaml.safe_dump(data, sort_keys=False, width=10_000))
    lines = spec.read_text().splitlines()
    res = kvd("lint", "--json", str(spec))
    f, router = json.loads(res.stdout)["findings"]  # KVD201, and the router's view of it (KVD212)
    assert (f["code"], router["code"], res.code) == ("KVD201", "KVD212", 1)
    assert '"kv_role":"kv_both"' in lines[f["line"] - 1]  # the argv item that holds the config


def test_image_can_be_given_with_spec(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    kvd("launch", "single", "--model", "m", "--save-spec", str(spec))
    assert "--image is required" in kvd("launch", "--spec", str(spec), "--format", "k8s").stderr
    res = kvd("launch", "--spec", str(spec), "--format", "k8s", "--image", "img:2")
    assert res.code == 0 and "image: 'img:2'" in res.stdout


def test_a_spec_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "bin.yaml"
    spec.write_bytes(b"version: 1\nlegs: []\n\xff\xfe\x00\x81 binary")
    res = kvd("launch", "--spec", str(spec))
    assert res.code == 2 and res.stderr == f"error: --spec: {spec} is not UTF-8 text\n"


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        # YAML's problem and line, not a JSON parser's complaint about line 1
        ("b2.yaml", "version: 1\nkind: single\nlegs: [\n", "b2.yaml:4: not valid YAML: expected the node content"),
        ("t.yaml", "version: 1\nlegs:\n  - name: a\n   role: single\n", "t.yaml:4: not valid YAML: expected <block end>"),
        ("q.yaml", 'version: 1\nlegs: []\npython: "x\n', "q.yaml:4: not valid YAML: found unexpected end of stream"),
        # JSON's message for a .json file, or one that looks like JSON
        ("s.json", '{"version": 1,\n "legs": [,]}\n', "s.json:2: not valid JSON: expecting value (column 11)"),
        ("s.spec", '{\n  "legs": [1,,2]\n}\n', "s.spec:2: not valid JSON: expecting value (column 14)"),
    ],
)  # fmt: skip
def test_a_spec_that_does_not_parse_names_the_parsers_problem_and_line(
    tmp_path: Path, name: str, text: str, needle: str
) -> None:
    (tmp_path / name).write_text(text)
    res = kvd("launch", "--spec", str(tmp_path / name))
    assert res.code == 2 and "Traceback" not in res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith(f"error: {tmp_path}/") and needle in first, first


def _saved(tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    res = kvd("launch", *args, "--json")
    assert res.code == 0, res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _refused(tmp_path: Path, data: object, name: str = "s.json") -> str:
    spec = tmp_path / name
    spec.write_text(json.dumps(data, indent=1) if name.endswith(".json") else str(data))
    res = kvd("launch", "--spec", str(spec))
    assert res.code == 2 and res.stdout == "" and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"error: {spec}:"), res.stderr
    return res.stderr.splitlines()[0]


def test_args_and_argv_that_disagree_are_refused(tmp_path: Path) -> None:
    data = _saved(tmp_path, "single", "--model", "m")
    leg = data["legs"][0]
    leg["argv"][leg["argv"].index("--model") + 1] = "m2"
    leg["args"] = ["--model", "m"]
    assert "legs[0].args gives --model 'm' but the command already has --model 'm2'; keep one" in _refused(
        tmp_path, data
    )
    leg["args"] = ["--model", "m2", "--max-model-len", "8192"]  # the same value, or a new flag: fine
    spec = tmp_path / "ok.json"
    spec.write_text(json.dumps(data))
    res = kvd("launch", "--spec", str(spec), "--json")
    assert res.code == 0 and "8192" in json.loads(res.stdout)["legs"][0]["argv"], res.stderr


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d.update(extra_key=1), "unknown key 'extra_key' (known: version, kind,"),
        (lambda d: d["legs"][0].update(arg=["--x"]), "legs[0]: unknown key 'arg'"),
        (lambda d: d["daemon"].update(max_byte="2G"), "daemon: unknown key 'max_byte'"),
        (lambda d: d.update(version=2), "spec version 2 is not supported (this kvd reads version 1)"),
        (lambda d: d.update(vllm_version="banana"), "vllm_version: 'banana' is not a version like 0.32"),
        (lambda d: d.update(kind="pd"), "legs[0] is a single leg, but kind pd has prefill and decode legs"),
        (lambda d: d.update(legs=[]), "legs is empty"),
        (lambda d: d["daemon"].update(socket="rel.sock", argv=None), "daemon.socket: 'rel.sock' is not an absolute"),
        (
            lambda d: d["daemon"].update(long_path="rel/dir", long_bytes="1T"),
            "daemon.long_path: 'rel/dir' is not an absolute path",
        ),
        (lambda d: d["legs"][0].update(argv=None, kv_transfer_config=None), "legs[0] has no --model"),
    ],
)  # fmt: skip
def test_launch_reads_a_spec_strictly(tmp_path: Path, change: object, needle: str) -> None:
    data = _saved(tmp_path, "single", "--model", "m")
    change(data)  # type: ignore[operator]
    first = _refused(tmp_path, data)
    assert needle in first, first


def test_a_version_2_spec_is_named_as_such_even_without_legs(tmp_path: Path) -> None:
    assert "spec version 2 is not supported" in _refused(tmp_path, "version: 2\nkind: single\n", "v.yaml")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("legs: [{}]\n", "legs[0] has no --model"),
        ("legs:\n  - args: [--model, m]\n", "legs[0] has no kv_transfer_config"),
        (
            "kind: pd\nlegs:\n  - args: [--model, m]\n    kv_transfer_config: {kv_connector: MooncakeConnector,"
            " kv_role: kv_producer}\n",
            "kind pd needs a decode leg",
        ),
    ],
)
def test_a_spec_leg_must_be_a_whole_engine(tmp_path: Path, text: str, needle: str) -> None:
    assert needle in _refused(tmp_path, text, "s.yaml")


def test_lint_still_reads_specs_leniently(tmp_path: Path) -> None:
    """What only `kvd launch --spec` refuses (a typo'd key, a leg without a model) is no parse error for lint."""
    spec = tmp_path / "s.yaml"
    spec.write_text("kind: single\nlegs:\n  - name: engine\n    note: hand-written\n")
    res = kvd("lint", "--json", str(spec))
    assert all(f["code"] != "KVD000" for f in json.loads(res.stdout)["findings"]), res.stdout
