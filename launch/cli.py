"""``kvd launch`` (single | pd | --spec FILE) and ``kvd lint``.

Only Typer and the daemon's flag table are imported here; the model, rules, templates and parsers
load when a command runs, so ``kvd --help`` stays fast. The daemon's flags of ``single`` and ``pd``
are the table's (:mod:`infera.kvd.flags`): same names, defaults and help as ``kvd serve``.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import typer

from infera.kvd.flagopts import ToolDefault, flatten, options
from infera.kvd.flags import FlagValues

launch_app = typer.Typer(
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


@dataclass(frozen=True)
class Output:
    """What to do with a deployment: the options every ``kvd launch`` form shares."""

    fmt: str = "shell"
    json_out: bool = False
    emit: bool = False
    out: str | None = None
    run: bool = False
    part: str = "all"
    save_spec: str | None = None
    vllm: bool = False
    prometheus: bool = False


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
    _param("out", typer.Option(None, "--out", help="Write the files into DIR."), str),
    _param(
        "run", typer.Option(False, "--run", help="Run the shell format now (replaces this process)."), bool
    ),
    _param(
        "part",
        typer.Option(
            "all",
            "--part",
            help="With --run: which part to start (all, kvd, or a leg name: engine, prefill, decode).",
        ),
        str,
    ),
    _param(
        "save_spec",
        typer.Option(
            None, "--save-spec", help="Also save the deployment as a spec file (.yaml/.yml or .json)."
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
with_output = flatten(OUTPUT_OPTIONS, into="output", make=lambda values, given: Output(**values))
with_daemon = flatten(options(env=False, defaults=LAUNCH_DEFAULTS, panel=DAEMON_PANEL), into="daemon")


def _emit(dep: Any, o: Output) -> int:
    """Check ``dep`` against every rule, then save, print, write or run it. Returns the exit status."""
    from infera.errors import KvdError, UsageError
    from infera.launch.render import FORMATS, join_files, render
    from infera.launch.rules import Context, check, parse_version
    from infera.launch.spec import save_spec as write_spec

    fmt = "json" if o.json_out else o.fmt
    if fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if o.run and fmt != "shell":
        raise UsageError("--run runs the shell format; drop --format or use --format shell")
    if o.vllm:
        _need_vllm()
    findings = check(dep, Context(vllm_version=parse_version(dep.vllm_version), use_vllm=o.vllm))
    for f in findings:
        where = f"{f.path}:{f.line}:{f.col} " if f.loc else ""
        typer.echo(f"{where}{f.code} [{f.severity}] {f.message}\n  fix: {f.fix}", err=True)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise KvdError(
            f"the deployment breaks {len(errors)} rule(s); nothing was written",
            hint="change the options or the spec as the findings say",
        )
    if o.save_spec:
        write_spec(dep, o.save_spec)
        typer.echo(f"wrote {o.save_spec}", err=True)
    files = render(dep, fmt)
    if fmt == "systemd":
        _warn_relative_exec(dep)
    if o.prometheus:
        from infera.launch.scrape import FILE, scrape_config

        files[FILE] = scrape_config(dep)
    if o.out:
        import os

        try:
            os.makedirs(o.out, exist_ok=True)
            for name, text in files.items():
                path = os.path.join(o.out, name)
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
                if name.endswith(".sh"):
                    os.chmod(path, 0o755)
                typer.echo(f"wrote {path}", err=True)
        except OSError as exc:
            raise UsageError(f"--out: cannot write {o.out}: {exc.strerror}") from None
    if o.run:
        import os

        sys.stdout.flush()
        os.execvp("bash", ["bash", "-c", files["launch.sh"], "launch.sh", o.part])
    if o.emit or not (o.out or o.save_spec):
        typer.echo(join_files(files), nl=False)
    return 0


def _warn_relative_exec(dep: Any) -> None:
    """systemd runs a bare name from its own PATH (/usr/local/bin, /usr/bin, ...), never a venv's."""
    for proc in dep.processes():
        exe = (proc.argv or [""])[0]
        if exe and not exe.startswith("/"):
            typer.echo(
                f"warning: {proc.name}: ExecStart runs {exe!r}, which systemd looks up in its own PATH "
                "(/usr/local/bin, /usr/bin, ...), never in a venv; give an absolute interpreter "
                "(--python PATH, or python: in the spec)",
                err=True,
            )


def _need_vllm() -> None:
    from infera.errors import UsageError
    from infera.launch.ktc import vllm_available

    if not vllm_available():
        raise UsageError(
            "--vllm: vLLM is not importable in this Python",
            hint="run kvd from the environment that has vLLM, or drop --vllm",
        )


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
        from infera.launch.spec import load_spec

        dep = load_spec(spec)
        dep.image = image or dep.image
        return _emit(dep, output)

    if not spec:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    raise typer.Exit(run_guarded(go) or 0)


def _raise(err: Exception) -> None:
    raise err


@launch_app.command("single")
@with_output
@with_daemon
def launch_single(
    daemon: FlagValues,
    output: Output,
    model: str = typer.Option(None, "--model", help="Model the engine serves (required)."),
    ais: bool = typer.Option(
        False, "--ais/--no-ais", help="GPU-direct L3 reads (INFERA_KVD_AIS=1, roots from --long-path)."
    ),
    hipfile_root: list[str] = typer.Option(
        [], "--hipfile-root", help="Extra GPU-direct root NAME=PATH (repeatable)."
    ),
    host: str = typer.Option("0.0.0.0", "--host", help="Address the engine listens on."),
    port: int = typer.Option(8000, "--port", help="Engine port."),
    hash_seed: str = typer.Option(
        "0", "--hash-seed", help="PYTHONHASHSEED of the engine, or 'none' (vLLM >= 0.29 only)."
    ),
    prewarm: bool = typer.Option(
        False, "--prewarm/--no-prewarm", help="Serve POST /v1/cache/prewarm (adds --kvd-socket-path)."
    ),
    engine_arg: list[str] = typer.Option(
        [], "--engine-arg", help="Extra engine flag, e.g. --engine-arg=--max-model-len=8192 (repeatable)."
    ),
    daemon_arg: list[str] = typer.Option(
        [], "--daemon-arg", help="Extra daemon flag, passed as is (repeatable)."
    ),
    python: str = typer.Option(None, "--python", metavar="PATH", help=PYTHON_HELP, show_default=False),
    image: str = typer.Option(None, "--image", help="Container image (needed for k8s and compose)."),
    vllm_version: str = typer.Option(
        None, "--vllm-version", help="vLLM version the engines run (recorded in the spec; sharpens rules)."
    ),
) -> None:
    """One host: the kvd daemon and one engine using it (the product doc's single-host commands)."""
    _launch(
        output, kind="single", daemon=daemon, model=model, ais=ais, hipfile_roots=hipfile_root, host=host,
        port=port, hash_seed=hash_seed, prewarm=prewarm, engine_args=engine_arg, daemon_args=daemon_arg,
        python=python, image=image, vllm_version=vllm_version,
    )  # fmt: skip


@launch_app.command("pd")
@with_output
@with_daemon
def launch_pd(
    daemon: FlagValues,
    output: Output,
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
    hipfile_root: list[str] = typer.Option(
        [], "--hipfile-root", help="Extra GPU-direct root NAME=PATH (repeatable)."
    ),
    host: str = typer.Option("0.0.0.0", "--host", help="Address the engines listen on."),
    hash_seed: str = typer.Option(
        "0", "--hash-seed", help="PYTHONHASHSEED of both legs, or 'none' (vLLM >= 0.29 only)."
    ),
    prewarm: bool = typer.Option(
        False, "--prewarm/--no-prewarm", help="Serve POST /v1/cache/prewarm on prefill."
    ),
    engine_arg: list[str] = typer.Option(
        [], "--engine-arg", help="Extra flag for both engines (repeatable)."
    ),
    daemon_arg: list[str] = typer.Option(
        [], "--daemon-arg", help="Extra daemon flag, passed as is (repeatable)."
    ),
    python: str = typer.Option(None, "--python", metavar="PATH", help=PYTHON_HELP, show_default=False),
    image: str = typer.Option(None, "--image", help="Container image (needed for k8s and compose)."),
    vllm_version: str = typer.Option(None, "--vllm-version", help="vLLM version the engines run."),
) -> None:
    """Prefill/decode: kvd daemon + prefill engine (MultiConnector over kvd and Mooncake) + decode engine."""
    _launch(
        output, kind="pd", daemon=daemon, model=model, etcd=etcd, advertise_host=advertise_host,
        decode_advertise_host=decode_advertise_host, prefill_port=prefill_port, decode_port=decode_port,
        discovery_backend=discovery_backend, request_transport=request_transport,
        kv_event_transport=kv_event_transport, ais=ais, hipfile_roots=hipfile_root, host=host, hash_seed=hash_seed,
        prewarm=prewarm, engine_args=engine_arg, daemon_args=daemon_arg, python=python, image=image,
        vllm_version=vllm_version,
    )  # fmt: skip


def _launch(output: Output, **kw: Any) -> None:
    from infera.clikit import run_guarded
    from infera.launch.build import LaunchOptions, build

    raise typer.Exit(run_guarded(lambda: _emit(build(LaunchOptions(**kw)), output)) or 0)


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
    app.command("lint")(lint)
