"""docs/pd.md embeds real ``kvd launch pd`` output: fail when a block drifts from what kvd prints."""

from __future__ import annotations

import json
import re

import pytest

from infera.discovery import docgen

TEXT = docgen.PAGE.read_text(encoding="utf-8")
BLOCKS = docgen.blocks(TEXT)


def test_the_page_has_its_generated_blocks() -> None:
    assert len(BLOCKS) >= 2
    assert all(b.argv[:3] == ["kvd", "launch", "pd"] for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_embedded_output_is_what_kvd_launch_prints(block: docgen.Block) -> None:
    assert block.body == docgen.run_kvd(block.argv), (
        f"docs/pd.md is stale for `{' '.join(block.argv)}`: run `python -m infera.discovery.docgen`"
    )


def test_the_documented_prefill_leg_is_the_one_that_pairs() -> None:
    script = BLOCKS[0].body
    configs = [json.loads(m) for m in re.findall(r"--kv-transfer-config '([^']+)'", script)]
    prefill, decode = configs
    assert prefill["kv_role"] == "kv_producer"
    children = prefill["kv_connector_extra_config"]["connectors"]
    assert [(c["kv_connector"], c["kv_role"]) for c in children] == [
        ("InferaKvdConnector", "kv_both"),
        ("MooncakeConnector", "kv_producer"),
    ]
    assert decode == {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}
    assert script.count("PYTHONHASHSEED=0") == 2, "both legs"
    assert "PYTHONHASHSEED" not in BLOCKS[1].body


def test_refresh_rewrites_a_stale_block() -> None:
    stale = TEXT.replace("VLLM_HOST_IP=10.0.0.12\n```", "VLLM_HOST_IP=10.0.0.99\n```", 1)
    assert stale != TEXT
    assert docgen.refresh(stale) == TEXT
