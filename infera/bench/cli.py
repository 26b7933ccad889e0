"""``kvd bench``: one sub-command per benchmark; each lives in its own module of this package."""

from __future__ import annotations

import typer

bench_app = typer.Typer(
    help="Benchmarks that print ratios against a baseline measured in the same run.",
    no_args_is_help=True,
)


@bench_app.command("arena")
def arena(
    chunk_size: str = typer.Option("4M", "--chunk-size", help="Chunk size for the put+get test."),
    rounds: int = typer.Option(200, "--rounds", help="Chunks put and got in the throughput test."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    index_chunks: int = typer.Option(100_000, "--index-chunks", help="Chunks indexed for the memory figure."),
) -> None:
    """The RAM tier through the daemon vs memcpy; LOOKUP/GET latency; daemon memory per 100k chunks."""
    from infera.bench.arena import run_arena_bench
    from infera.clikit import run_guarded

    run_guarded(
        run_arena_bench, chunk_size=chunk_size, rounds=rounds, json_out=json_out, index_chunks=index_chunks
    )


@bench_app.command("disk")
def disk(
    path: str = typer.Option(
        None, "--path", help="Directory on the filesystem to measure (default: $TMPDIR, else /var/tmp)."
    ),
    chunks: int = typer.Option(64, "--chunks", help="Chunks written and read back."),
    chunk_size: str = typer.Option("4M", "--chunk-size", help="Size of each chunk."),
    files: int = typer.Option(
        100_000, "--files", help="Chunk files on disk for the start-time test (0: skip)."
    ),
    fsync: str = typer.Option(
        "data", "--fsync", help="Durability policy for both sides: none, data, always."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The disk tier vs raw file I/O (write, cold read); daemon start time with many chunk files."""
    from infera.bench.disk import run_disk_bench
    from infera.clikit import run_guarded

    run_guarded(
        run_disk_bench,
        path=path,
        chunks=chunks,
        chunk_size=chunk_size,
        files=files,
        fsync=fsync,
        json_out=json_out,
    )


@bench_app.command("top-render")
def top_render(
    clients: int = typer.Option(
        200, "--clients", help="Clients in the STATS reply (rows of the client table)."
    ),
    history: int = typer.Option(10_000, "--history", help="Points in each sparkline series."),
    frames: int = typer.Option(20, "--frames", help="Frames measured (after 3 warm-up frames)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """`kvd top` frame render time vs its 50 ms budget and vs an empty frame."""
    from infera.bench.top_render import run_top_render_bench
    from infera.clikit import run_guarded

    run_guarded(run_top_render_bench, clients=clients, history=history, frames=frames, json_out=json_out)


@bench_app.command("l4")
def l4(
    chunk_size: str = typer.Option("4M", "--chunk-size", help="Size of each chunk."),
    count: int = typer.Option(32, "--count", help="Chunks put and got per round."),
    rounds: int = typer.Option(5, "--rounds", help="Rounds (medians are reported)."),
    batch: int = typer.Option(8, "--batch", help="Keys per kvd GET request."),
    master: str = typer.Option(
        None, "--master", help="Use this running mooncake_master (HOST:PORT) instead of a throwaway one."
    ),
    metadata: str = typer.Option(None, "--metadata", help="Its metadata service (with --master)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Put and get through kvd into Mooncake vs Mooncake's own client (ratio; target >= 0.9)."""
    from infera.bench.l4 import run_l4_bench
    from infera.clikit import run_guarded

    code = run_guarded(
        run_l4_bench,
        chunk_size=chunk_size,
        count=count,
        rounds=rounds,
        batch=batch,
        master=master,
        metadata=metadata,
        json_out=json_out,
    )
    raise typer.Exit(code or 0)


@bench_app.command("ttft")
def ttft(
    python: str = typer.Option(None, "--python", help="A Python with vLLM (default: this one)."),
    sizes: str = typer.Option("1024,4096,16384", "--sizes", help="Prompt lengths in tokens."),
    hidden: int = typer.Option(1024, "--hidden", help="Hidden size of the random-weight Llama."),
    layers: int = typer.Option(8, "--layers", help="Layers of the random-weight Llama."),
    model: str = typer.Option(None, "--model", help="Model directory (built there if missing)."),
    repeat: int = typer.Option(1, "--repeat", help="Measurements per prompt length."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Time to first token of a kvd hit vs recompute on a real vLLM engine (ratios in one run)."""
    from infera.bench.ttft import run_ttft_bench
    from infera.clikit import run_guarded

    run_guarded(
        run_ttft_bench,
        python=python,
        sizes=sizes,
        hidden=hidden,
        layers=layers,
        model=model,
        repeat=repeat,
        json_out=json_out,
    )


@bench_app.command("compare")
def compare(
    quick: bool = typer.Option(False, "--quick", help="Fewer prompt lengths, chunks and repeats (minutes)."),
    only: str = typer.Option(
        None, "--only", help="Comma-separated parts: ttft, store, restart (default: all)."
    ),
    out: str = typer.Option(
        "kvd-bench-compare", "--out", help="Directory for results.json, compare.md and the plots."
    ),
    docs: str = typer.Option(
        None, "--docs", help="Also rewrite this Markdown file's generated block (plots into img/ beside it)."
    ),
    vllm_python: str = typer.Option(
        None, "--vllm-python", help="Python for the vLLM engines (default: .venv-bench, else .venv-vllm032)."
    ),
    threads: int = typer.Option(1, "--threads", help="OMP threads per vLLM engine."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
) -> None:
    """kvd next to its peers: TTFT on vLLM, store throughput, restart to warm (tables and plots)."""
    from infera.bench.compare import run_compare
    from infera.clikit import run_guarded

    code = run_guarded(
        run_compare,
        quick=quick,
        only=only,
        out=out,
        docs=docs,
        vllm_python=vllm_python,
        threads=threads,
        json_out=json_out,
    )
    raise typer.Exit(code or 0)


@bench_app.command("transfer")
def transfer(
    models: str = typer.Option("8b,70b,mla", "--models", help="Model shapes: 8b, 70b (TP4 share), mla."),
    dtypes: str = typer.Option("bf16,fp8", "--dtypes", help="KV dtypes: bf16, fp8 (uint8 storage)."),
    layouts: str = typer.Option(
        "0.26,0.29", "--layouts", help="vLLM KV layouts: 0.26 (per layer), 0.29 (views)."
    ),
    chunk_mib: str = typer.Option(
        "0.5,2,4,16,64", "--chunk-mib", help="Chunk sizes in MiB (rounded to blocks)."
    ),
    tokens: int = typer.Option(16384, "--tokens", help="Prompt tokens moved per round."),
    repeat: int = typer.Option(3, "--repeat", help="Rounds per row after one warm-up (medians)."),
    unregistered: bool = typer.Option(
        True, "--unregistered/--no-unregistered", help="Add a row with the arena not registered."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    device: str = typer.Option("cuda", "--device", help="cuda, or cpu for a dry run of the code paths."),
    staging_mib: int = typer.Option(768, "--staging-mib", help="GPU staging (INFERA_KVD_GPU_STAGING_MB)."),
    kernels: str = typer.Option(
        "auto",
        "--kernels",
        help="INFERA_KVD_COPY_KERNEL values to run (auto, triton, torch); auto,torch compares them.",
    ),
) -> None:
    """GPU KV <-> daemon arena through the worker's real save/load code, vs the pinned copy ceiling."""
    from infera.bench.transfer import run_transfer_bench
    from infera.clikit import run_guarded

    run_guarded(
        run_transfer_bench,
        models=models,
        dtypes=dtypes,
        layouts=layouts,
        chunk_mib=chunk_mib,
        tokens=tokens,
        repeat=repeat,
        unregistered=unregistered,
        json_out=json_out,
        device_name=device,
        staging_mib=staging_mib,
        kernels=kernels,
    )


@bench_app.command("gpu-e2e")
def gpu_e2e(
    python: str = typer.Option(None, "--python", help="A Python with vLLM (default: this one)."),
    sizes: str = typer.Option("4096,16384", "--sizes", help="Prompt lengths in tokens."),
    repeat: int = typer.Option(3, "--repeat", help="Measured requests per case (medians)."),
    small: bool = typer.Option(False, "--small", help="Tiny models instead of the 8B shape (CPU dry run)."),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Token check with a real-weight small Llama."
    ),
    out: str = typer.Option(None, "--out", help="Directory for results.json and the engine/daemon logs."),
    native_cpu_gb: float = typer.Option(8.0, "--native-cpu-gb", help="cpu_bytes_to_use of vLLM's connector."),
    timeout: float = typer.Option(420.0, "--timeout", help="Seconds allowed per engine process."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    gemma3_sizes: str = typer.Option(
        "16384",
        "--gemma3-sizes",
        help="Prompt lengths of the Gemma-3-12B-shaped hybrid rows (sliding-window layers, vLLM's "
        "hybrid KV cache manager on); empty for none.",
    ),
) -> None:
    """TTFT on a GPU with vLLM: recompute, vLLM native CPU hit, kvd RAM/cross-engine/disk hits, GPU hit."""
    from infera.bench.gpu_e2e import run_gpu_e2e
    from infera.clikit import run_guarded

    run_guarded(
        run_gpu_e2e,
        python=python,
        sizes=sizes,
        repeat=repeat,
        small=small,
        check=check,
        out=out,
        native_cpu_gb=native_cpu_gb,
        timeout=timeout,
        json_out=json_out,
        gemma3_sizes=gemma3_sizes,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
