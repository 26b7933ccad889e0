"""Golden files of what `kvd launch` prints, single-host and P/D, in every format.

Regenerate after an intended change with ``KVD_UPDATE_GOLDEN=1 pytest tests/launch/test_launch_golden.py``
and review the diff.

``single`` and ``pd`` are the product documentation's commands, which size the RAM tier with
``--max-bytes 16G``; ``single-ram`` takes every default, so its daemon gets the daemon's own default
(``--max-bytes 1G``: `kvd launch` and `kvd serve` share the flag table, defaults included).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from launchkit import kvd

GOLDEN = Path(__file__).resolve().parent / "golden"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
IMAGE = "ghcr.io/example/infera-kvd:0.1"
# an absolute interpreter, as systemd needs (the default is the Python running kvd launch, which
# differs between machines; tests/launch/test_launch_validators.py checks the default itself)
PYTHON = "/opt/infera-kvd/.venv/bin/python"
CASES = {
    "single": [
        "single", "--model", MODEL, "--max-bytes", "16G", "--long-path", "/nvme/kvd-long", "--long-bytes", "256G",
        "--image", IMAGE, "--python", PYTHON,
    ],
    "single-ram": ["single", "--model", MODEL, "--image", IMAGE, "--python", PYTHON],
    "pd": [
        "pd", "--model", MODEL, "--etcd", "etcd.internal:2379", "--advertise-host", "10.0.0.5",
        "--decode-advertise-host", "10.0.0.6", "--max-bytes", "16G", "--long-path", "/nvme/kvd-long", "--long-bytes", "256G",
        "--ais", "--image", IMAGE, "--python", PYTHON,
    ],
}  # fmt: skip
EXT = {
    "shell": "sh",
    "json": "json",
    "env": "env.txt",
    "systemd": "systemd.txt",
    "k8s": "k8s.yaml",
    "compose": "compose.yaml",
}

# The product doc's commands, verbatim: what the emitted engines must pass.
DOC_SINGLE_KTC = '\'{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}\''
DOC_PREFILL_KTC = (
    '\'{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":'
    '[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},'
    '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}\''
)
DOC_DECODE_KTC = '\'{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}\''


# Outputs with no golden file of their own: another case's golden file with these edits. The
# single-ram script is the single one but for the daemon's sizing flags.
DERIVED = {
    ("single-ram", "shell"): (
        "single",
        "    --max-bytes 16G \\\n    --long-path /nvme/kvd-long \\\n    --long-bytes 256G\n",
        "    --max-bytes 1G\n",
    ),
}


@pytest.mark.parametrize("fmt", list(EXT))
@pytest.mark.parametrize("case", list(CASES))
def test_emitted_output_matches_golden(case: str, fmt: str) -> None:
    res = kvd("launch", *CASES[case], "--format", fmt, "--emit")
    assert res.code == 0, res.stderr
    if (case, fmt) in DERIVED:
        base, old, new = DERIVED[case, fmt]
        golden = (GOLDEN / f"{base}.{EXT[fmt]}").read_text()
        assert old in golden
        assert res.stdout == golden.replace(old, new)
        return
    path = GOLDEN / f"{case}.{EXT[fmt]}"
    if os.environ.get("KVD_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(res.stdout)
    assert res.stdout == path.read_text(), f"{path.name} changed; KVD_UPDATE_GOLDEN=1 regenerates it"


def test_single_shell_has_the_product_docs_commands() -> None:
    out = kvd("launch", *CASES["single"]).stdout
    assert (
        f"{PYTHON} -m infera.kvd \\\n    --socket /var/run/infera-kvd.sock \\\n    --max-bytes 16G \\\n"
        in out
    )
    assert "--long-path /nvme/kvd-long \\\n    --long-bytes 256G\n" in out
    assert (
        f"  PYTHONHASHSEED=0 \\\n  INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\\n  {PYTHON} -m infera.engine.vllm"
        in out
    )
    assert f"--enable-prefix-caching \\\n    --kv-transfer-config {DOC_SINGLE_KTC}\n" in out


def test_pd_shell_has_the_product_docs_legs() -> None:
    out = kvd("launch", *CASES["pd"]).stdout
    assert f"--kv-transfer-config {DOC_PREFILL_KTC}\n" in out
    assert f"--kv-transfer-config {DOC_DECODE_KTC}\n" in out
    prefill = out[out.index("start_prefill()") : out.index("start_decode()")]
    decode = out[out.index("start_decode()") : out.index("wait_for_socket()")]
    for line in ("INFERA_KVD_AIS=1", "INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long", "VLLM_HOST_IP=10.0.0.5"):
        assert line in prefill
    for flag in (
        "--etcd-endpoint etcd.internal:2379",
        "--discovery-backend etcd",
        "--request-transport http",
        "--kv-event-transport zmq",
    ):
        assert flag in prefill and flag in decode
    assert "INFERA_KVD" not in decode and "--enable-prefix-caching" not in decode
    assert "PYTHONHASHSEED=0" in prefill and "PYTHONHASHSEED=0" in decode
