"""KVD1xx: the kv-transfer-config itself."""

from __future__ import annotations

import json
from collections.abc import Iterator

from infera.launch import ktc as K
from infera.launch.model import KTC_FLAG, KVD_CONNECTOR, KVD_MODULE, Deployment
from infera.launch.rules.registry import Context, Hit, Severity, rule


@rule(
    "KVD101",
    "kv-transfer-config-invalid",
    Severity.ERROR,
    "The --kv-transfer-config is valid JSON that vLLM's KVTransferConfig accepts.",
    "Write the config as one JSON object with known fields and a kv_role on every connector, "
    "e.g. the output of `kvd launch single --format json`.",
)
def ktc_invalid(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks that every `--kv-transfer-config` is a JSON object that vLLM's `KVTransferConfig` accepts:
    only known fields, each of the right type, a `kv_role` of `kv_producer`, `kv_consumer` or `kv_both`
    whenever `kv_connector` is set, a non-empty `kv_connector_module_path`, and the same for every child
    of a `MultiConnector` (vLLM builds one `KVTransferConfig` per child when the engine starts).

    The check is built in and needs no vLLM. `kvd lint --vllm` also builds vLLM's own class from each
    config when vLLM is importable, and reports what it rejects.

    ## Why it matters
    vLLM parses the config only when the engine starts, and a bad `MultiConnector` child fails even
    later, after the model has loaded. A typo found in CI costs seconds; found at start it costs a model
    load, on every replica.

    ## Example
    ```sh
    python -m infera.engine.vllm --model m \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
    ```

    Use instead:
    {{KVD_ENGINE_SH}}

    ## Fix
    Add the missing `kv_role`, remove unknown fields, and quote the JSON for the shell with single
    quotes so the double quotes inside survive.
    """
    for leg in dep.legs:
        use = leg.flag(KTC_FLAG)
        if use is not None:
            if use.value_index in leg.unknown_args:
                continue
            loc = leg.where_flag(KTC_FLAG)
            if use.value is None:
                yield Hit(f"{KTC_FLAG} has no value", loc)
                continue
            try:
                parsed = json.loads(use.value)
            except json.JSONDecodeError as exc:
                yield Hit(f"{KTC_FLAG} is not valid JSON: {exc.msg} at character {exc.pos}", loc)
                continue
        else:
            parsed = leg.ktc()
            if parsed is None:
                continue
            loc = leg.where_flag(next((u.name for u in leg.flags() if u.name.startswith(KTC_FLAG)), KTC_FLAG))
        errors = K.builtin_errors(parsed)
        for err in errors:
            yield Hit(f"{KTC_FLAG}: {err}", loc)
        if not errors and ctx.use_vllm and isinstance(parsed, dict):
            for err in K.vllm_errors(parsed):
                yield Hit(f"{KTC_FLAG}: {err}", loc)


@rule(
    "KVD102",
    "kv-transfer-config-removed-field",
    Severity.WARNING,
    "The config uses no field that vLLM 0.32 removed (kv_buffer_size, kv_rank, kv_parallel_size, kv_ip).",
    "Delete the field: no connector of infera-kvd reads it, and vLLM >= 0.32 refuses the config.",
)
def ktc_removed_field(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds `kv_buffer_size`, `kv_rank`, `kv_parallel_size` and `kv_ip` in a kv-transfer-config (top
    level or a `MultiConnector` child). vLLM removed these fields from `KVTransferConfig` in 0.32.

    It is a warning when the target vLLM version is unknown and an error with `--vllm-version 0.32`
    or later (or a spec file that says so).

    ## Why it matters
    Older guides for the P2P and LMCache connectors still show these fields. vLLM 0.32 and later reject
    any config that has them, so an engine upgrade turns a working command into one that does not start.

    ## Example
    ```json
    {"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_buffer_size":1e9,
     "kv_connector_module_path":"infera.engine.vllm.kvd_connector"}
    ```

    Use instead:
    {{KVD_KTC_JSON}}

    ## Fix
    Delete the field. The kvd connector sizes its buffers from the daemon's arena, not from the config.
    """
    fatal = ctx.vllm_version is not None and ctx.vllm_version >= (0, 32)
    for leg in dep.legs:
        for name in K.removed_fields(leg.ktc()):
            yield Hit(
                f"{KTC_FLAG}: field {name} was removed in vLLM 0.32, which refuses configs that set it",
                leg.where_flag(KTC_FLAG),
                severity=Severity.ERROR if fatal else None,
            )


@rule(
    "KVD103",
    "kvd-connector-module-path",
    Severity.ERROR,
    f"InferaKvdConnector is loaded through kv_connector_module_path {KVD_MODULE!r}.",
    f'Add "kv_connector_module_path":"{KVD_MODULE}" next to "kv_connector":"InferaKvdConnector".',
)
def kvd_module_path(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks that each `InferaKvdConnector` entry (top level or `MultiConnector` child) names its module:
    `"kv_connector_module_path":"infera.engine.vllm.kvd_connector"`.

    ## Why it matters
    The connector is not part of vLLM. Without the module path vLLM looks the class name up in its
    own registry, finds nothing, and the engine fails at start. A different path imports some other
    module, or nothing.

    ## Example
    ```json
    {"kv_connector":"InferaKvdConnector","kv_role":"kv_both"}
    ```

    Use instead:
    {{KVD_KTC_JSON}}

    ## Fix
    Add the module path to every `InferaKvdConnector` entry, including the child of a `MultiConnector`.
    """
    for leg in dep.legs:
        for c in leg.connectors():
            if c.name != KVD_CONNECTOR or c.module_path == KVD_MODULE:
                continue
            where = f" ({c.where})" if c.where else ""
            if c.module_path is None:
                msg = f"InferaKvdConnector{where} has no kv_connector_module_path: vLLM cannot find the class"
            else:
                msg = f"InferaKvdConnector{where} has kv_connector_module_path {c.module_path!r}, not {KVD_MODULE!r}"
            yield Hit(msg, leg.where_flag(KTC_FLAG))


@rule(
    "KVD104",
    "kvd-connector-role",
    Severity.ERROR,
    "InferaKvdConnector's own kv_role is kv_both (it is a cache tier that saves and loads).",
    'Set "kv_role":"kv_both" on the InferaKvdConnector entry; in P/D keep kv_producer on the top level.',
)
def kvd_role(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks that every `InferaKvdConnector` entry has `"kv_role":"kv_both"`, whether it is the top-level
    connector of a single-host engine or a child of a prefill leg's `MultiConnector`.

    ## Why it matters
    kvd is a cache below the GPU: it stores KV blocks and loads them back. The connector acts on its own
    role (a `MultiConnector` child's role is the child's): with `kv_producer` it stores prompts but
    loads no hits, so the leg recomputes every prefix it has seen; with `kv_consumer` it loads hits but
    stores nothing, so nothing new is ever cached. It logs which one at start. In prefill/decode the
    `kv_producer` role belongs on the top level (the router reads it) and on the transport child, not
    on the kvd child.

    ## Example
    ```json
    {"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[
      {"kv_connector":"InferaKvdConnector","kv_role":"kv_producer","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},
      {"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}]}}
    ```

    Use instead:
    {{PREFILL_KTC_JSON}}

    ## Fix
    Give the kvd entry `kv_role` `kv_both`.
    """
    for leg in dep.legs:
        for c in leg.connectors():
            if c.name == KVD_CONNECTOR and c.role is not None and c.role != "kv_both":
                where = f" ({c.where})" if c.where else ""
                yield Hit(
                    f"InferaKvdConnector{where} has kv_role {c.role!r}: a cache tier must be 'kv_both'",
                    leg.where_flag(KTC_FLAG),
                )
