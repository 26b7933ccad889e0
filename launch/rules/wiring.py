"""KVD401-KVD405, KVD408: how an engine reaches its daemon (socket, prefix caching, prewarm, its env values)."""

from __future__ import annotations

from collections.abc import Iterator

from infera.engine.vllm.config import VARIABLES, check_value, parse_chunk_tokens
from infera.keyrules import CHUNK_TOKENS_ENV as CHUNK
from infera.keyrules import ROOTS_ENV as ROOTS
from infera.launch.model import KTC_FLAG, Daemon, Deployment, Leg, norm_path
from infera.launch.rules.gpudirect import parse_roots
from infera.launch.rules.registry import Context, Hit, Severity, rule

SOCKET = "INFERA_KVD_SOCKET"
DEFAULT_SOCKET = "<per-user default>"


def _daemon_socket(d: Daemon) -> str | None:
    """The daemon's socket: ``--socket``, else its ``INFERA_KVD_SOCKET``, else the per-user default."""
    if d.argv is None:
        return None
    if d.has_flag("--socket"):
        return d.socket
    if SOCKET in d.env:
        return d.env[SOCKET]
    return DEFAULT_SOCKET if d.env_complete else None


@rule(
    "KVD401",
    "prefix-caching-with-kvd",
    Severity.ERROR,
    "An engine with InferaKvdConnector runs with --enable-prefix-caching.",
    "Add --enable-prefix-caching to the engine command (and drop --no-enable-prefix-caching).",
)
def prefix_caching(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    On every leg with an `InferaKvdConnector`: `--no-enable-prefix-caching` is an **error**; a command
    without `--enable-prefix-caching` is a **warning**.

    ## Why it matters
    kvd sits below vLLM's prefix cache. vLLM computes the block hashes that kvd's chunk keys come from
    only when prefix caching (or a connector) is on, and with prefix caching off a block loaded from
    kvd is not kept for the next request of the same prefix. vLLM's default for prefix caching has
    changed between versions and depends on the model type, so the documented command says it.

    ## Example
    ```sh
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model m --no-enable-prefix-caching \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
    ```

    Use instead:
    ```sh
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model m --enable-prefix-caching \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
    ```

    ## Fix
    Pass `--enable-prefix-caching` to every engine that uses kvd.
    """
    for leg in dep.legs:
        if leg.argv is None or not leg.uses_kvd():
            continue
        if leg.has_flag("--no-enable-prefix-caching"):
            yield Hit(
                f"leg {leg.name!r} uses kvd with --no-enable-prefix-caching",
                leg.where_flag("--no-enable-prefix-caching"),
            )
        elif not leg.has_flag("--enable-prefix-caching"):
            yield Hit(
                f"leg {leg.name!r} uses kvd without --enable-prefix-caching",
                leg.where_flag(KTC_FLAG),
                severity=Severity.WARNING,
            )


@rule(
    "KVD402",
    "kvd-socket-mismatch",
    Severity.ERROR,
    "INFERA_KVD_SOCKET equals the daemon's --socket.",
    "Use the daemon's --socket path as INFERA_KVD_SOCKET on every engine of the host.",
)
def socket_mismatch(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Compares each engine's `INFERA_KVD_SOCKET` with the `--socket` of the daemon(s) in the same file
    (or in the files linted `--together`). A daemon without `--socket` listens on a per-user default
    path, which an explicit engine socket does not match.

    ## Why it matters
    The connector finds the daemon only through this path. With a wrong path the engine cannot connect;
    it serves every request by recomputing and logs the failure once. Throughput drops, nothing fails.

    ## Example
    ```sh
    python -m infera.kvd --socket /run/kvd.sock --max-bytes 16G &
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    Use instead:
    ```sh
    python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G &
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    ## Fix
    Write the path once (a shell variable, or `kvd launch`) and use it for both.
    """
    sockets = [_daemon_socket(d) for d in dep.daemons]
    if not sockets or any(s is None for s in sockets):
        return
    for leg in dep.legs:
        sock = leg.env_value(SOCKET)
        if sock is None:
            continue
        if norm_path(sock) not in {norm_path(s) for s in sockets if s is not None}:
            shown = ", ".join(s for s in sockets if s is not None)
            yield Hit(
                f"INFERA_KVD_SOCKET={sock} on leg {leg.name!r}, but the daemon listens on {shown}",
                leg.where_env(SOCKET),
            )


@rule(
    "KVD403",
    "kvd-socket-unset",
    Severity.WARNING,
    "An engine with InferaKvdConnector sets INFERA_KVD_SOCKET.",
    "Set INFERA_KVD_SOCKET to the daemon's --socket path on the engine.",
)
def socket_unset(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Warns when a leg with `InferaKvdConnector` does not set `INFERA_KVD_SOCKET`, unless the daemon in
    the same file also runs on the default path.

    ## Why it matters
    Without the variable the connector falls back to a per-user default path
    (`$XDG_RUNTIME_DIR/infera-kvd.sock`), which differs between users and is rarely where a system
    daemon listens. vLLM does not wire the connector to the daemon by itself.

    ## Example
    ```sh
    PYTHONHASHSEED=0 python -m infera.engine.vllm --model m --enable-prefix-caching \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
    ```

    Use instead:
    ```sh
    PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model m --enable-prefix-caching \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
    ```

    ## Fix
    Export `INFERA_KVD_SOCKET` for the engine process.
    """
    if any(_daemon_socket(d) == DEFAULT_SOCKET for d in dep.daemons):
        return
    for leg in dep.legs:
        if leg.uses_kvd() and leg.env_is_unset(SOCKET):
            yield Hit(
                f"leg {leg.name!r} uses InferaKvdConnector but INFERA_KVD_SOCKET is not set", leg.where()
            )


@rule(
    "KVD404",
    "kvd-env-without-connector",
    Severity.ERROR,
    "An engine that sets INFERA_KVD_* also passes a kv-transfer-config with InferaKvdConnector.",
    "Add --kv-transfer-config with InferaKvdConnector (kvd launch prints it); the variables alone do nothing.",
)
def env_without_connector(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds an engine command (not a decode leg: see KVD204) that sets `INFERA_KVD_SOCKET` or other
    `INFERA_KVD_*` variables but whose `--kv-transfer-config` has no `InferaKvdConnector`, or that has
    no `--kv-transfer-config` at all.

    ## Why it matters
    vLLM does not add the connector on its own. The environment variables configure a connector that is
    never loaded: the engine runs without kvd and nobody is told.

    ## Example
    ```sh
    PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\
    python -m infera.engine.vllm --model m --enable-prefix-caching
    ```

    Use instead:
    ```sh
    PYTHONHASHSEED=0 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock \\
    python -m infera.engine.vllm --model m --enable-prefix-caching \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'
    ```

    ## Fix
    Pass the kv-transfer-config, or drop the variables if the engine is not meant to use kvd.
    """
    for leg in dep.legs:
        env = leg.kvd_env()
        if not env or leg.argv is None or leg.role == "decode":
            continue
        use = leg.flag(KTC_FLAG)
        if use is not None and (use.value_index in leg.unknown_args or leg.ktc() is None):
            continue
        if leg.uses_kvd() or (leg.role == "prefill" and leg.ktc() is not None):  # KVD202 covers prefill
            continue
        yield Hit(
            f"leg {leg.name!r} sets {env[0]} but runs no InferaKvdConnector: vLLM does not add it on its own",
            leg.where_env(env[0]),
        )


@rule(
    "KVD405",
    "prewarm-socket-path",
    Severity.ERROR,
    "Prewarm (POST /v1/cache/prewarm) is served only with --kvd-socket-path, equal to INFERA_KVD_SOCKET.",
    "Start the engine with `python -m infera.engine.vllm ... --kvd-socket-path <daemon socket>`.",
)
def prewarm(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    * A file that calls `/v1/cache/prewarm` (a `curl` in a script, a readiness hook) while no engine in
      it has `--kvd-socket-path`: **error** at the call.
    * `--kvd-socket-path` that differs from the engine's `INFERA_KVD_SOCKET`: **error**.
    * `--kvd-socket-path` on plain `vllm serve`, which does not know the flag: **error**.

    ## Why it matters
    The prewarm route exists only in infera's engine entry point, and only when it knows the daemon's
    socket. Without the flag the route answers 404; with another socket it warms a daemon the
    connector does not read from.

    ## Example
    ```sh
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model m ... &
    curl -X POST localhost:8000/v1/cache/prewarm -d '{"prompt": "..."}'
    ```

    Use instead:
    ```sh
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model m \\
      --kvd-socket-path /var/run/infera-kvd.sock ... &
    curl -X POST localhost:8000/v1/cache/prewarm -d '{"prompt": "..."}'
    ```

    ## Fix
    `kvd launch single --prewarm` adds the flag with the right path.
    """
    with_flag = []
    for leg in dep.legs:
        if not leg.has_flag("--kvd-socket-path"):
            continue
        with_flag.append(leg)
        loc = leg.where_flag("--kvd-socket-path")
        if leg.entry != "infera":
            yield Hit(
                f"leg {leg.name!r}: --kvd-socket-path exists only in `python -m infera.engine.vllm`", loc
            )
        path, sock = leg.flag_value("--kvd-socket-path"), leg.env_value(SOCKET)
        if path is not None and sock is not None and norm_path(path) != norm_path(sock):
            yield Hit(
                f"leg {leg.name!r}: --kvd-socket-path {path} differs from INFERA_KVD_SOCKET={sock}", loc
            )
    if dep.prewarm_refs and not with_flag and any(leg.argv is not None for leg in dep.legs):
        for ref in dep.prewarm_refs:
            yield Hit(
                "calls /v1/cache/prewarm, but no engine here has --kvd-socket-path (the route answers 404)",
                ref,
            )


@rule(
    "KVD408",
    "kvd-env-value",
    Severity.ERROR,
    "INFERA_KVD_* variables have values the connector accepts.",
    "Use a value the connector accepts (docs/engine.md lists every variable with its values).",
)
def env_values(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Checks the value of every `INFERA_KVD_*` variable the connector reads, with the connector's own
    parsers (`infera/engine/vllm/config.py`), so lint refuses exactly what the engine refuses:

    {{CONNECTOR_VARIABLES}}

    It also asks for two things the connector takes but that mislead:

    * `INFERA_KVD_SOCKET` and every path of `INFERA_KVD_HIPFILE_ROOTS` are absolute;
    * a fixed `INFERA_KVD_CHUNK_TOKENS` is a multiple of `--block-size` when the command sets one
      (the connector rounds it up to whole blocks, so the engine would not use the number written).

    ## Why it matters
    The connector reads these variables when the engine starts, and a value it refuses stops the
    engine: `python -m infera.engine.vllm` exits at once with one `error:` line, other entry points
    (`vllm serve`, `LLM(...)`) fail while vLLM builds the connector. A relative socket path resolves
    against each process's working directory, so the engine and the daemon can disagree.

    ## Example
    ```sh
    INFERA_KVD_AIS=yes INFERA_KVD_LOAD_POLICY=sometimes INFERA_KVD_SOCKET=kvd.sock python -m infera.engine.vllm ...
    ```

    Use instead:
    ```sh
    INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long INFERA_KVD_LOAD_POLICY=auto \\
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    ## Fix
    Use a value the message names; [engine.md](../engine.md) lists every variable, its default and
    what it does.
    """
    for leg in dep.legs:
        for var in VARIABLES:
            text = leg.env_value(var.name)
            if text is None:
                continue
            err = check_value(var.name, text)
            if err is not None:
                yield Hit(f"{err.message} (leg {leg.name!r})", leg.where_env(var.name), fix=err.hint)
        yield from _misleading_values(leg)


def _misleading_values(leg: Leg) -> Iterator[Hit]:
    """Values the connector takes that still mislead (KVD408's extras)."""
    chunk = leg.env_value(CHUNK)
    tokens = parse_chunk_tokens(chunk) if chunk is not None and check_value(CHUNK, chunk) is None else None
    block = leg.flag_value("--block-size")
    if tokens is not None and block and block.isdigit() and int(block) > 0 and tokens % int(block):
        yield Hit(
            f"INFERA_KVD_CHUNK_TOKENS={chunk} on leg {leg.name!r} is not a multiple of --block-size {block}",
            leg.where_env(CHUNK),
        )
    roots = leg.env_value(ROOTS)
    for name, path in (parse_roots(roots) or {}).items() if roots is not None else ():
        if not path.startswith("/"):
            yield Hit(
                f"INFERA_KVD_HIPFILE_ROOTS root {name}={path} on leg {leg.name!r} is not an absolute path",
                leg.where_env(ROOTS),
            )
    sock = leg.env_value(SOCKET)
    if sock and not sock.startswith("/"):
        yield Hit(
            f"INFERA_KVD_SOCKET={sock!r} on leg {leg.name!r} is not an absolute path",
            leg.where_env(SOCKET),
        )
