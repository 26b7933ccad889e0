"""The shell reader: quoting, continuations, variables, exported environment, wrappers, nested scripts."""

from __future__ import annotations

import shlex

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.launch.lint.shell import read_shell
from infera.launch.lint.shtok import ShellSyntaxError, tokenize
from infera.launch.lint.units import split_systemd
from infera.launch.render import q_compose, q_sh, q_systemd, q_yaml

KTC = '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'


def legs(script: str):  # type: ignore[no-untyped-def]
    return read_shell(script, "t.sh").legs


def words(text: str) -> list[str]:
    return ["".join(seg.text for seg in t.word.segs) for t in tokenize(text) if t.kind == "word" and t.word]


def test_quotes_escapes_and_continuations() -> None:
    assert words("a 'b c' \"d \\\"e\\\"\" f\\ g $'h\\ti' j\\\n  k") == [
        "a",
        "b c",
        'd "e"',
        "f g",
        "h\ti",
        "j",
        "k",
    ]
    assert words("x'y'\"z\" # comment 'not closed\nnext") == ["xyz", "next"]
    assert words("echo a#b") == ["echo", "a#b"]


@pytest.mark.parametrize("bad", ["echo 'x", 'echo "x', "echo $(date", "cat <<EOF\nnever closed\n", "echo `x"])
def test_unterminated_constructs_are_syntax_errors(bad: str) -> None:
    with pytest.raises(ShellSyntaxError):
        tokenize(bad)


def test_prefix_assignments_and_exported_env() -> None:
    (leg,) = legs(
        f"export A=1\nB=2\nC=3 python -m infera.engine.vllm --model m --kv-transfer-config '{KTC}'\n"
    )
    assert leg.env == {"A": "1", "C": "3"}  # B is a shell variable, not exported


def test_set_a_exports_later_assignments_only_until_plus_a() -> None:
    (leg,) = legs("set -a\nA=1\nset +a\nB=2\nexport B_LATER=$B\npython -m infera.engine.vllm --model m\n")
    assert leg.env == {"A": "1", "B_LATER": "2"}


def test_export_of_an_earlier_variable_and_unset() -> None:
    (leg,) = legs("S=/run/kvd.sock\nexport S\nexport T=1\nunset T\npython -m infera.engine.vllm\n")
    assert leg.env == {"S": "/run/kvd.sock"}


def test_variables_expand_and_unknowns_stay_unknown() -> None:
    (leg,) = legs(
        'SOCK=${X:-/run/a.sock}\nINFERA_KVD_SOCKET="$SOCK" M=$1 python -m infera.engine.vllm --model "$MODEL"\n'
    )
    assert leg.env == {"INFERA_KVD_SOCKET": "/run/a.sock", "M": None}
    assert leg.flag_value("--model") is None and leg.has_flag("--model")


def test_env_command_wrappers_and_env_u() -> None:
    script = (
        "export PYTHONHASHSEED=0\n"
        "nohup env -u PYTHONHASHSEED A=1 numactl --membind 0 --cpunodebind=0 taskset -c 0-7 "
        "python3 -u -m infera.engine.vllm --model m > log 2>&1 &\n"
        "exec env -i B=2 /opt/venv/bin/python -m infera.engine.vllm --model m\n"
    )
    first, second = legs(script)
    assert first.env == {"A": "1"} and first.argv[:3] == ["python3", "-u", "-m"]
    assert second.env == {"B": "2"}


def test_positions_point_at_the_written_place() -> None:
    script = "# header\nPYTHONHASHSEED=0 \\\n  INFERA_KVD_SOCKET=/s \\\n  python -m infera.engine.vllm \\\n    --model m\n"
    (leg,) = legs(script)
    assert (leg.loc.line, leg.loc.first_line, leg.loc.last_line) == (2, 2, 5)
    assert (leg.where_env("INFERA_KVD_SOCKET").line, leg.where_env("INFERA_KVD_SOCKET").col) == (3, 3)
    assert (leg.where_flag("--model").line, leg.where_flag("--model").col) == (5, 13)


def test_nested_scripts_bash_c_heredoc_and_ssh() -> None:
    script = (
        "export PYTHONHASHSEED=0\n"
        "bash -c 'A=1 python -m infera.engine.vllm --model one'\n"
        "bash <<EOF\nB=2 python -m infera.engine.vllm --model two\nEOF\n"
        "ssh -i key host <<'EOF'\nC=3 python -m infera.engine.vllm --model three\nEOF\n"
        "ssh host 'D=4 python -m infera.engine.vllm --model four'\n"
    )
    got = {leg.flag_value("--model"): (leg.env, leg.loc.line) for leg in legs(script)}
    assert got == {
        "one": ({"PYTHONHASHSEED": "0", "A": "1"}, 2),
        "two": ({"PYTHONHASHSEED": "0", "B": "2"}, 4),
        "three": ({"C": "3"}, 7),  # the remote host does not inherit the local environment
        "four": ({"D": "4"}, 9),
    }


def test_docker_run_environment_and_mounts() -> None:
    script = (
        "export PYTHONHASHSEED=0 FROM_SHELL=x\n"
        "docker run --rm -e INFERA_KVD_SOCKET=/s -e FROM_SHELL --env=C=3 -v /boot:/boot:ro "
        "--mount type=bind,source=/nvme,target=/nvme img:1 python -m infera.engine.vllm --model m\n"
    )
    dep = read_shell(script, "t.sh")
    (leg,) = dep.legs
    assert leg.env == {"INFERA_KVD_SOCKET": "/s", "FROM_SHELL": "x", "C": "3"}  # no PYTHONHASHSEED inside
    assert [(m.host_path, m.target) for m in dep.mounts] == [("/boot", "/boot"), ("/nvme", "/nvme")]


def test_kvd_serve_and_vllm_serve_are_recognized() -> None:
    dep = read_shell("kvd serve --socket /s &\nvllm serve org/m --kv-transfer-config x\n", "t.sh")
    assert dep.daemons[0].socket == "/s"
    assert dep.legs[0].entry == "vllm" and dep.legs[0].model() == "org/m"


def test_other_commands_are_ignored_but_prewarm_calls_are_noted() -> None:
    dep = read_shell("python train.py\ncurl -X POST http://h:8000/v1/cache/prewarm -d '{}'\n", "t.sh")
    assert dep.processes() == [] and [r.line for r in dep.prewarm_refs] == [2]


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_shell_quoting_reads_back(value: str) -> None:
    assert words("x " + q_sh(value)) == ["x", value] or value == ""
    assert shlex.split(q_sh(value)) == [value]


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_yaml_and_compose_quoting_read_back(value: str) -> None:
    assert yaml.safe_load("v: " + q_yaml(value))["v"] == value
    assert yaml.safe_load("v: " + q_compose(value))["v"].replace("$$", "$") == value


@settings(max_examples=200, deadline=None)
@given(TEXT.filter(lambda s: "\n" not in s and "\r" not in s))
def test_systemd_quoting_reads_back(value: str) -> None:
    text = "x " + q_systemd(value)
    out = [w.text for w in split_systemd(text, [(1, i + 1) for i in range(len(text))], {}, "u")]
    assert out == ["x", value] or (value.strip() == "" and out[0] == "x")
