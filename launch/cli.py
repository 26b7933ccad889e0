"""``kvd launch`` (single | pd | --spec FILE) and ``kvd lint``.

Only Typer and the daemon's flag table are imported here; the model, rules, templates and parsers
load when a command runs, so ``kvd --help`` stays fast. The daemon's flags of ``single`` and ``pd``
are the table's (:mod:`infera.kvd.flags`): same names, defaults and help as ``kvd serve``.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import typer

from infera.clikit import OneLineCommand, OneLineGroup
from infera.kvd.flagopts import ToolDefault, flatten, options
from infera.kvd.flags import FlagValues
from infera.launch.emit import Output

launch_app = typer.Typer(
    cls=OneLineGroup,
    help="Print, write or run validated kvd daemon + vLLM engine commands (shell, json, env, systemd, k8s, compose).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

FORMAT_HELP = "shell, json, env, systemd, k8s or compose."
PYTHON_HELP = (
    "Python interpreter of every command, with infera-kvd (and, for the engines, vLLM) installed "
    f"[default: this kvd's Python, {sys.executable}; with --image: python3 from the image's PATH]."
)

# kvd launch's one default that differs from the daemon's, and why (its help says so)
LAUNCH_DEFAULTS = {
    "--socket": ToolDefault(
        "/var/run/infera-kvd.sock",
        "kvd launch writes one system path into the daemon's command and every engine's INFERA_KVD_SOCKET",
    )
}
DAEMON_PANEL = "Daemon (the flags of kvd serve)"


def _param(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


OUTPUT_OPTIONS = [
    _param("fmt", typer.Option("shell", "--format", "-f", help=FORMAT_HELP), str),
    _param("json_out", typer.Option(False, "--json", help="Same as --format json."), bool),
    _param(
        "emit",
        typer.Option(
            False, "--emit", help="Print the output (the default unless --out, --run or --save-spec)."
        ),
        bool,
    ),
    _param(
        "out",
        typer.Option(None, "--out", metavar="DIR", help="Write the files into DIR (created if missing)."),
        str,
    ),
    _param(
        "force",
        typer.Option(
            False,
            "--force",
            help="With --out or --save-spec: replace files that hold something else "
            "(without it such a file is an error; the same content is always fine).",
        ),
        bool,
    ),
    _param(
        "run", typer.Option(False, "--run", help="Run the shell format now (replaces this process)."), bool
    ),
    _param(
        "part",
        typer.Option(
            "all",
            "--part",
            help="With --run: which part to start (all, kvd, or a leg name: engine, prefill, decode, router).",
        ),
        str,
    ),
    _param(
        "save_spec",
        typer.Option(
            None,
            "--save-spec",
            metavar="FILE",
            help="Also save the deployment as a spec file; its suffix (.yaml, .yml or .json) picks the format.",
        ),
        str,
    ),
    _param(
        "vllm",
        typer.Option(
            False,
            "--vllm",
            help="Also validate kv-transfer-configs with vLLM's own KVTransferConfig (slow import).",
        ),
        bool,
    ),
]
OUTPUT_OPTIONS.append(
    _param(
        "prometheus",
        typer.Option(
            False,
            "--prometheus",
            help="Also output prometheus-kvd.yml: scrape jobs for the daemon's --metrics-port and each engine.",
        ),
        bool,
    )
)
with_output = flatten(OUTPUT_OPTIONS, into="output", make=lambda values, given: Output(**values, given=given))
with_daemon = flatten(options(env=False, defaults=LAUNCH_DEFAULTS, panel=DAEMON_PANEL), into="daemon")


@launch_app.callback(invoke_without_command=True)
@with_output
def launch_main(
    ctx: typer.Context,
    output: Output,
    spec: str = typer.Option(
        None, "--spec", help="Render a spec file (YAML or JSON) instead of building one from options."
    ),
    image: str = typer.Option(
        None, "--image", help="Container image for k8s and compose (overrides the spec's)."
    ),
) -> None:
    """Validated deployments: `kvd launch single ...`, `kvd launch pd ...`, or `kvd launch --spec FILE`."""
    from infera.clikit import run_guarded
    from infera.errors import UsageError

    if ctx.invoked_subcommand is not None:
        if spec:
            run_guarded(
                _raise,
                UsageError(
                    "--spec renders a saved deployment: use `kvd launch --spec FILE` without single/pd"
                ),
            )
        return

    def go() -> int:
        from infera.launch.specfile import load_spec

        dep = load_spec(spec)
        dep.image = image or dep.image
        from infera.launch.emit import emit

        return emit(dep, output)

    if not spec:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    raise typer.Exit(run_guarded(go) or 0)


def _raise(err: Exception) -> None:
    raise err


# the options of every engine, in `single` and `pd` alike; ``_launch`` takes them by these names
ENGINE_OPTIONS = [
    _param(
        "hipfile_roots",
        typer.Option([], "--hipfile-root", help="Extra GPU-direct root NAME=PATH (repeatable)."),
        list[str],
    ),
    _param("host", typer.Option("0.0.0.0", "--host", help="Address the engines listen on."), str),
    _param(
        "hash_seed",
        typer.Option(
            "0", "--hash-seed", help="PYTHONHASHSEED of every engine, or 'none' (vLLM >= 0.29 only)."
        ),
        str,
    ),
    _param(
        "prewarm",
        typer.Option(
            False,
            "--prewarm/--no-prewarm",
            help="Serve POST /v1/cache/prewarm (on prefill; adds --kvd-socket-path).",
        ),
        bool,
    ),
    _param(
        "engine_args",
        typer.Option(
            [],
            "--engine-arg",
            help="Extra flag for every engine, e.g. --engine-arg=--max-model-len=8192 (repeatable).",
        ),
        list[str],
    ),
    _param(
        "daemon_args",
        typer.Option([], "--daemon-arg", help="Extra daemon flag, passed as is (repeatable)."),
        list[str],
    ),
    _param(
        "python", typer.Option(None, "--python", metavar="PATH", help=PYTHON_HELP, show_default=False), str
    ),
    _param("image", typer.Option(None, "--image", help="Container image (needed for k8s and compose)."), str),
    _param(
        "vllm_version",
        typer.Option(
            None,
            "--vllm-version",
            help="vLLM version the engines run (recorded in the spec; sharpens rules).",
        ),
        str,
    ),
]
with_engines = flatten(ENGINE_OPTIONS, into="engines", make=lambda values, given: values)


@launch_app.command("single")
@with_output
@with_daemon
@with_engines
def launch_single(
    daemon: FlagValues,
    output: Output,
    engines: dict[str, Any],
    model: str = typer.Option(None, "--model", help="Model the engine serves (required)."),
    ais: bool = typer.Option(
        False, "--ais/--no-ais", help="GPU-direct L3 reads (INFERA_KVD_AIS=1, roots from --long-path)."
    ),
    port: int = typer.Option(8000, "--port", help="Engine port."),
) -> None:
    """One host: the kvd daemon and one engine using it (the product doc's single-host commands)."""
    _launch(output, kind="single", daemon=daemon, model=model, ais=ais, port=port, **engines)


@launch_app.command("pd")
@with_output
@with_daemon
@with_engines
def launch_pd(
    daemon: FlagValues,
    output: Output,
    engines: dict[str, Any],
    model: str = typer.Option(None, "--model", help="Model both legs serve (required)."),
    etcd: str = typer.Option(
        None, "--etcd", help="etcd endpoint HOST:PORT both legs register in (required)."
    ),
    advertise_host: str = typer.Option(
        None, "--advertise-host", help="Routable address of the prefill host (required; also VLLM_HOST_IP)."
    ),
    decode_advertise_host: str = typer.Option(
        None,
        "--decode-advertise-host",
        help="Routable address of the decode host [default: --advertise-host].",
    ),
    prefill_port: int = typer.Option(8001, "--prefill-port", help="Prefill engine port."),
    decode_port: int = typer.Option(8002, "--decode-port", help="Decode engine port."),
    discovery_backend: str = typer.Option(
        "etcd", "--discovery-backend", help="Discovery backend of both legs."
    ),
    request_transport: str = typer.Option(
        "http", "--request-transport", help="Request transport of both legs."
    ),
    kv_event_transport: str = typer.Option(
        "zmq", "--kv-event-transport", help="KV event transport of both legs."
    ),
    ais: bool = typer.Option(False, "--ais/--no-ais", help="GPU-direct L3 reads on the prefill leg."),
    router: bool = typer.Option(
        True, "--router/--no-router", help="Also write vllm-router's command (--no-router: you run your own)."
    ),
    router_port: int = typer.Option(
        None,
        "--router-port",
        help="Port the router serves clients on [default: 8000].",
        show_default=False,
    ),
    transfer_protocol: str = typer.Option(
        None,
        "--transfer-protocol",
        help="tcp or rdma: the Mooncake transfer protocol of both legs [default: vLLM's, rdma].",
    ),
) -> None:
    """Prefill/decode: kvd daemon + prefill engine (MultiConnector over kvd and Mooncake) + decode engine
    + vllm-router in front of them."""
    _launch(
        output, kind="pd", daemon=daemon, model=model, etcd=etcd, advertise_host=advertise_host,
        decode_advertise_host=decode_advertise_host, prefill_port=prefill_port, decode_port=decode_port,
        discovery_backend=discovery_backend, request_transport=request_transport,
        kv_event_transport=kv_event_transport, ais=ais, router=router, router_port=router_port,
        transfer_protocol=transfer_protocol, **engines,
    )  # fmt: skip


def _launch(output: Output, **kw: Any) -> None:
    from infera.clikit import run_guarded
    from infera.launch.build import LaunchOptions, build
    from infera.launch.emit import emit

    raise typer.Exit(run_guarded(lambda: emit(build(LaunchOptions(**kw)), output)) or 0)


def lint(
    files: list[str] = typer.Argument(None, help="Files to check; '-' reads stdin.", show_default=False),
    fmt: str = typer.Option("text", "--format", "-f", help="text, json, sarif or github."),
    json_out: bool = typer.Option(
        False, "--json", help="Same as --format json (with --list-rules: the rules as JSON)."
    ),
    ftype: str = typer.Option(None, "--type", help="Force the file type: shell, env, systemd, yaml or json."),
    stdin_filename: str = typer.Option(
        "-", "--stdin-filename", help="Name to report for stdin (also picks its type)."
    ),
    together: bool = typer.Option(
        False, "--together", help="Check all files as one deployment (e.g. one systemd unit per process)."
    ),
    select: str = typer.Option(None, "--select", help="Only these rules (comma-separated codes or names)."),
    ignore: str = typer.Option(None, "--ignore", help="Skip these rules (comma-separated codes or names)."),
    vllm_version: str = typer.Option(
        None,
        "--vllm-version",
        help="vLLM version the engines run, e.g. 0.32 (sharpens version-dependent rules).",
    ),
    vllm: bool = typer.Option(
        False,
        "--vllm",
        help="Also build vLLM's own KVTransferConfig from each config (needs vLLM; slow import).",
    ),
    list_rules: bool = typer.Option(False, "--list-rules", help="List the rules and exit."),
    explain: str = typer.Option(
        None, "--explain", help="Print the docs page of a rule (code or name) and exit."
    ),
) -> None:
    """Check shell scripts, spec files, Kubernetes manifests, compose files and systemd units.

    One line per finding (file:line:col, rule code, severity in brackets, message), then its fix.
    Exit status 0: no error (warnings allowed); 1: a rule reports an error; 2: usage error.
    Silence a finding with `# kvd: ignore[RULE]` on its line, or alone on the line above.
    """
    from infera.clikit import run_guarded
    from infera.launch.lint.run import run_lint

    raise typer.Exit(
        run_guarded(
            run_lint,
            files or [],
            fmt,
            json_out,
            ftype,
            stdin_filename,
            together,
            select,
            ignore,
            vllm_version,
            vllm,
            list_rules,
            explain,
        )
        or 0
    )


def register(app: typer.Typer) -> None:
    app.add_typer(launch_app, name="launch")
    app.command("lint", cls=OneLineCommand)(lint)
