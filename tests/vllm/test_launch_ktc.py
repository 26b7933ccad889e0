"""`kvd launch` output against the real vLLM: the recorded kv-transfer-configs parse through KVTransferConfig.

Runs only in the vLLM venvs (``.venv-vllm032/bin/pytest tests/vllm/test_launch_ktc.py``). The emitted
shell is executed with `python` replaced by the recording stub of tests/launch; what the stub recorded
is what an engine would have received.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))

from launchkit import kvd, local_args, run_script

from infera.launch.ktc import vllm_errors


def _configs(records: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """The engines' kv-transfer-configs; the P/D router (the only other process the script
    runs through ``python``) has none."""
    out = []
    for rec in records:
        argv = rec["argv"]
        if argv[1:3] == ["-m", "vllm_router.launch_router"]:
            assert "--kv-transfer-config" not in argv
            continue
        out.append(json.loads(argv[argv.index("--kv-transfer-config") + 1]))
    return out


@pytest.mark.parametrize("kind", ["single", "pd"])
def test_recorded_kv_transfer_config_parses_through_vllm(short_tmp: Path, kind: str) -> None:
    from vllm.config import KVTransferConfig

    sock = str(short_tmp / "kvd.sock")
    args = local_args(kind, sock)
    # `--python python`: the stub of run_script is the `python` first on PATH
    code, records, out = run_script(kvd("launch", *args, "--python", "python").stdout, short_tmp)
    assert code == 0, out
    configs = _configs(records)
    assert len(configs) == (1 if kind == "single" else 2)
    roles = set()
    for cfg in configs:
        ktc = KVTransferConfig(**cfg)
        roles.add(ktc.kv_role)
        assert ktc.kv_connector == cfg["kv_connector"]
        for child in cfg.get("kv_connector_extra_config", {}).get("connectors", []):
            child_ktc = KVTransferConfig(**child)  # what MultiConnector builds for each child at start
            assert child_ktc.kv_role == child["kv_role"]
        assert vllm_errors(cfg) == []
    assert roles == ({"kv_both"} if kind == "single" else {"kv_producer", "kv_consumer"})
    routers = [r for r in records if r["argv"][1:3] == ["-m", "vllm_router.launch_router"]]
    assert len(routers) == (0 if kind == "single" else 1)  # `bash launch.sh all` starts the router too


def test_lint_vllm_reports_what_vllm_rejects(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text(
        "PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\\n"
        "python -m infera.engine.vllm --model m --enable-prefix-caching \\\n"
        '  --kv-transfer-config \'{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":'
        '{"connectors":[{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","kv_port":"not-a-port"}]}}\'\n'
    )
    res = kvd("lint", "--format", "json", "--vllm", str(bad))
    messages = [f["message"] for f in json.loads(res.stdout)["findings"] if f["code"] == "KVD101"]
    assert res.code == 1
    assert any("kv_port" in m for m in messages), messages


def test_builtin_check_agrees_with_vllm_on_the_corpus() -> None:
    """Every kv-transfer-config in the corpus: the built-in check rejects it iff vLLM does."""
    from infera.launch.ktc import builtin_errors
    from infera.launch.lint import Source, read_source

    corpus = Path(__file__).resolve().parents[1] / "launch" / "corpus"
    checked = 0
    for path in sorted(corpus.rglob("*")):
        if not path.is_file() or path.name == "expected.yaml":
            continue
        dep, _ = read_source(Source(str(path), path.read_text()))
        for leg in dep.legs:
            cfg = leg.ktc()
            if cfg is None:
                continue
            removed = {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"}
            if removed & set(cfg):
                continue  # accepted by some versions only (rule KVD102)
            checked += 1
            assert bool(builtin_errors(cfg)) == bool(vllm_errors(cfg)), (path.name, cfg, vllm_errors(cfg))
    assert checked >= 20
