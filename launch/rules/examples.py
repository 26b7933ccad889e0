"""The right configurations and commands that several rules' docs pages show under "Use instead".

A rule's docstring names one as ``{{NAME}}`` on a line of its own; :func:`expand` puts the fenced
block in when the rule is registered, so each is written once and the pages cannot disagree about it.
``CONNECTOR_VARIABLES`` is the list of the connector's variables, from its own table.
"""

from __future__ import annotations

import re

from infera.engine.vllm.config import VARIABLES


def _fenced(lang: str, text: str) -> str:
    return f"```{lang}\n{text}\n```"


EXAMPLES = {
    # an engine on kvd: the connector with its role and module path
    "KVD_ENGINE_SH": _fenced(
        "sh",
        "python -m infera.engine.vllm --model m \\\n"
        """  --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","""
        """"kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'""",
    ),
    # the same connector entry as JSON
    "KVD_KTC_JSON": _fenced(
        "json",
        '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both",\n'
        ' "kv_connector_module_path":"infera.engine.vllm.kvd_connector"}',
    ),
    # a prefill leg: kvd as the cache tier, Mooncake as the transport to decode
    "PREFILL_KTC_JSON": _fenced(
        "json",
        '{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[\n'
        '  {"kv_connector":"InferaKvdConnector","kv_role":"kv_both",'
        '"kv_connector_module_path":"infera.engine.vllm.kvd_connector"},\n'
        '  {"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}',
    ),
    # the router in front of a P/D pair, as `kvd launch pd` writes it
    "ROUTER_SH": _fenced(
        "sh",
        "python -m vllm_router.launch_router --host 0.0.0.0 --port 8000 \\\n"
        "  --vllm-pd-disaggregation --kv-connector mooncake \\\n"
        "  --prefill http://10.0.0.11:8001 8998 --decode http://10.0.0.12:8002",
    ),
    # an engine reading L3 chunk files itself (GPU-direct) under the daemon's --long-path
    "AIS_ENGINE_SH": _fenced(
        "sh",
        "INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long \\\n"
        "INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...",
    ),
}

# not an example: the variables KVD408 checks, from the connector's own table (never a stale list)
EXAMPLES["CONNECTOR_VARIABLES"] = ", ".join(f"`{v.name}`" for v in VARIABLES) + "."

_NAME = re.compile(r"^\{\{(\w+)\}\}$", re.M)


def expand(doc: str) -> str:
    """``doc`` with each ``{{NAME}}`` line replaced by ``EXAMPLES[NAME]``."""
    return _NAME.sub(lambda m: EXAMPLES[m.group(1)], doc)
