"""``kvd launch`` (single | pd | --spec FILE) and ``kvd lint``.

Only Typer is imported here; the model, rules, templates and parsers load when a command runs, so
``kvd --help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

launch_app = typer.Typer(
    help="Print, write or run validated kvd daemon + vLLM engine commands (shell, json, env, systemd, k8s, compose).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

FORMAT_HELP = "shell, json, env, systemd, k8s or compose."


def _emit(
    dep: Any,
    fmt: str,
    json_out: bool,
    emit: bool,
    out: str | None,
    run: bool,
    part: str,
    save_spec: str | None,
    use_vllm: bool,
) -> int:
    """Check ``dep`` against every rule, then save, print, write or run it. Returns the exit status."""
    from infera.errors import KvdError, UsageError
    from infera.launch.render import FORMATS, join_files, render
    from infera.launch.rules import Context, check, parse_version
    from infera.launch.spec import save_spec as write_spec

    fmt = "json" if json_out else fmt
    if fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if run and fmt != "shell":
        raise UsageError("--run runs the shell format; drop --format or use --format shell")
    if use_vllm:
        _need_vllm()
    findings = check(dep, Context(vllm_version=parse_version(dep.vllm_version), use_vllm=use_vllm))
    for f in findings:
        where = f"{f.path}:{f.line}:{f.col} " if f.loc else ""
        typer.echo(f"{where}{f.code} [{f.severity}] {f.message}\n  fix: {f.fix}", err=True)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise KvdError(
            f"the deployment breaks {len(errors)} rule(s); nothing was written",
            hint="change the options or the spec as the findings say",
        )
    if save_spec:
        write_spec(dep, save_spec)
        typer.echo(f"wrote {save_spec}", err=True)
    files = render(dep, fmt)
    if out:
        import os

        try:
            os.makedirs(out, exist_ok=True)
            for name, text in files.items():
                path = os.path.join(out, name)
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
                if name.endswith(".sh"):
                    os.chmod(path, 0o755)
                typer.echo(f"wrote {path}", err=True)
        except OSError as exc:
            raise UsageError(f"--out: cannot write {out}: {exc.strerror}") from None
    if run:
        import os

        sys.stdout.flush()
        os.execvp("bash", ["bash", "-c", files["launch.sh"], "launch.sh", part])
    if emit or not (out or save_spec):
        typer.echo(join_files(files), nl=False)
    return 0


def _need_vllm() -> None:
    from infera.errors import UsageError
    from infera.launch.ktc import vllm_available

    if not vllm_available():
        raise UsageError(
            "--vllm: vLLM is not importable in this Python",
            hint="run kvd from the environment that has vLLM, or drop --vllm",
        )


@launch_app.callback(invoke_without_command=True)
def launch_main(
    ctx: typer.Context,
    spec: str = typer.Option(
        None, "--spec", help="Render a spec file (YAML or JSON) instead of building one from options."
    ),
    fmt: str = typer.Option("shell", "--format", "-f", help=FORMAT_HELP),
    json_out: bool = typer.Option(False, "--json", help="Same as --format json."),
    emit: bool = typer.Option(
        False, "--emit", help="Print the output (the default unless --out, --run or --save-spec)."
    ),
    out: str = typer.Option(None, "--out", help="Write the files into DIR."),
    run: bool = typer.Option(False, "--run", help="Run the shell format now (replaces this process)."),
    part: str = typer.Option(
        "all", "--part", help="With --run: which part to start (all, kvd, or a leg name)."
    ),
    save_spec: str = typer.Option(
        None, "--save-spec", help="Also save the deployment as a spec file (.yaml/.yml or .json)."
    ),
    vllm: bool = typer.Option(
        False,
        "--vllm",
        help="Also validate kv-transfer-configs with vLLM's own KVTransferConfig (slow import).",
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
        return _emit(dep, fmt, json_out, emit, out, run, part, save_spec, vllm)

    if not spec:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    raise typer.Exit(run_guarded(go) or 0)


def _raise(err: Exception) -> None:
    raise err


def _opts(**kw: Any) -> Any:
    from infera.launch.build import LaunchOptions

    return LaunchOptions(**kw)


@launch_app.command("single")
def launch_single(
    model: str = typer.Option(None, "--model", help="Model the engine serves (required)."),
    socket: str = typer.Option(
        "/var/run/infera-kvd.sock", "--socket", help="Daemon socket path (INFERA_KVD_SOCKET of the engine)."
    ),
    max_bytes: str = typer.Option("16G", "--max-bytes", help="RAM tier size."),
    long_path: str = typer.Option(None, "--long-path", help="Disk tier (L3) directory."),
    long_bytes: str = typer.Option(
        None, "--long-bytes", help="Disk tier capacity (needed with --long-path)."
    ),
    long_backend: str = typer.Option(
        None, "--long-backend", help="disk, mooncake or lmcache (distributed L4)."
    ),
    mooncake_master: str = typer.Option(None, "--mooncake-master", help="Mooncake master HOST:PORT."),
    mooncake_metadata: str = typer.Option(None, "--mooncake-metadata", help="Mooncake metadata server URL."),
    mooncake_protocol: str = typer.Option(None, "--mooncake-protocol", help="tcp or rdma."),
    mooncake_device: str = typer.Option(None, "--mooncake-device", help="RDMA device(s) for Mooncake."),
    lmcache_url: str = typer.Option(
        None, "--lmcache-url", help="lmcache_server lm://HOST:PORT (with --long-backend lmcache)."
    ),
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
        [], "--daemon-arg", help="Extra daemon flag, e.g. --daemon-arg=--metrics-port=9400 (repeatable)."
    ),
    python: str = typer.Option("python", "--python", help="Python interpreter in the commands."),
    image: str = typer.Option(None, "--image", help="Container image (needed for k8s and compose)."),
    vllm_version: str = typer.Option(
        None, "--vllm-version", help="vLLM version the engines run (recorded in the spec; sharpens rules)."
    ),
    fmt: str = typer.Option("shell", "--format", "-f", help=FORMAT_HELP),
    json_out: bool = typer.Option(False, "--json", help="Same as --format json."),
    emit: bool = typer.Option(
        False, "--emit", help="Print the output (the default unless --out, --run or --save-spec)."
    ),
    out: str = typer.Option(None, "--out", help="Write the files into DIR."),
    run: bool = typer.Option(False, "--run", help="Run the shell format now (replaces this process)."),
    part: str = typer.Option("all", "--part", help="With --run: all, kvd or engine."),
    save_spec: str = typer.Option(None, "--save-spec", help="Also save the deployment as a spec file."),
    vllm: bool = typer.Option(
        False, "--vllm", help="Also validate with vLLM's own KVTransferConfig (slow import)."
    ),
) -> None:
    """One host: the kvd daemon and one engine using it (the product doc's single-host commands)."""
    from infera.clikit import run_guarded
    from infera.launch.build import build

    def go() -> int:
        o = _opts(
            kind="single", model=model, socket=socket, max_bytes=max_bytes, long_path=long_path, long_bytes=long_bytes,
            long_backend=long_backend, mooncake_master=mooncake_master, mooncake_metadata=mooncake_metadata,
            mooncake_protocol=mooncake_protocol, mooncake_device=mooncake_device, lmcache_url=lmcache_url, ais=ais, hipfile_roots=hipfile_root,
            host=host, port=port, hash_seed=hash_seed, prewarm=prewarm, engine_args=engine_arg, daemon_args=daemon_arg,
            python=python, image=image, vllm_version=vllm_version,
        )  # fmt: skip
        return _emit(build(o), fmt, json_out, emit, out, run, part, save_spec, vllm)

    raise typer.Exit(run_guarded(go) or 0)


@launch_app.command("pd")
def launch_pd(
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
    socket: str = typer.Option(
        "/var/run/infera-kvd.sock", "--socket", help="Daemon socket on the prefill host."
    ),
    max_bytes: str = typer.Option("16G", "--max-bytes", help="RAM tier size."),
    long_path: str = typer.Option(None, "--long-path", help="Disk tier (L3) directory."),
    long_bytes: str = typer.Option(
        None, "--long-bytes", help="Disk tier capacity (needed with --long-path)."
    ),
    long_backend: str = typer.Option(
        None, "--long-backend", help="disk, mooncake or lmcache (distributed L4)."
    ),
    mooncake_master: str = typer.Option(None, "--mooncake-master", help="Mooncake master HOST:PORT."),
    mooncake_metadata: str = typer.Option(None, "--mooncake-metadata", help="Mooncake metadata server URL."),
    mooncake_protocol: str = typer.Option(None, "--mooncake-protocol", help="tcp or rdma."),
    mooncake_device: str = typer.Option(None, "--mooncake-device", help="RDMA device(s) for Mooncake."),
    lmcache_url: str = typer.Option(
        None, "--lmcache-url", help="lmcache_server lm://HOST:PORT (with --long-backend lmcache)."
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
    daemon_arg: list[str] = typer.Option([], "--daemon-arg", help="Extra daemon flag (repeatable)."),
    python: str = typer.Option("python", "--python", help="Python interpreter in the commands."),
    image: str = typer.Option(None, "--image", help="Container image (needed for k8s and compose)."),
    vllm_version: str = typer.Option(None, "--vllm-version", help="vLLM version the engines run."),
    fmt: str = typer.Option("shell", "--format", "-f", help=FORMAT_HELP),
    json_out: bool = typer.Option(False, "--json", help="Same as --format json."),
    emit: bool = typer.Option(
        False, "--emit", help="Print the output (the default unless --out, --run or --save-spec)."
    ),
    out: str = typer.Option(None, "--out", help="Write the files into DIR."),
    run: bool = typer.Option(False, "--run", help="Run the shell format now (replaces this process)."),
    part: str = typer.Option("all", "--part", help="With --run: all, kvd, prefill or decode."),
    save_spec: str = typer.Option(None, "--save-spec", help="Also save the deployment as a spec file."),
    vllm: bool = typer.Option(
        False, "--vllm", help="Also validate with vLLM's own KVTransferConfig (slow import)."
    ),
) -> None:
    """Prefill/decode: kvd daemon + prefill engine (MultiConnector over kvd and Mooncake) + decode engine."""
    from infera.clikit import run_guarded
    from infera.launch.build import build

    def go() -> int:
        o = _opts(
            kind="pd", model=model, etcd=etcd, advertise_host=advertise_host,
            decode_advertise_host=decode_advertise_host, prefill_port=prefill_port, decode_port=decode_port,
            discovery_backend=discovery_backend, request_transport=request_transport,
            kv_event_transport=kv_event_transport, socket=socket, max_bytes=max_bytes, long_path=long_path,
            long_bytes=long_bytes, long_backend=long_backend, mooncake_master=mooncake_master,
            mooncake_metadata=mooncake_metadata, mooncake_protocol=mooncake_protocol, mooncake_device=mooncake_device, lmcache_url=lmcache_url,
            ais=ais, hipfile_roots=hipfile_root, host=host, hash_seed=hash_seed, prewarm=prewarm,
            engine_args=engine_arg, daemon_args=daemon_arg, python=python, image=image, vllm_version=vllm_version,
        )  # fmt: skip
        return _emit(build(o), fmt, json_out, emit, out, run, part, save_spec, vllm)

    raise typer.Exit(run_guarded(go) or 0)


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
