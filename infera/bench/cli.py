"""``kvd bench``: one sub-command per benchmark; each lives in its own module of this package.

A command declares its options and names its benchmark with :func:`runs`; the options are the
benchmark's keyword arguments, and its module is imported only when the command runs, so
``kvd --help`` stays fast.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import typer

from infera.loadreport import DEFAULT_POLICY

bench_app = typer.Typer(
    help="Benchmarks that print ratios against a baseline measured in the same run.",
    no_args_is_help=True,
)


def runs(
    module: str, function: str, status: bool = False
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The command runs ``infera.bench.<module>.<function>(**its options)`` (a KvdError is one line,
    Ctrl-C exit status 130); with ``status`` what the benchmark returns is the exit status."""

    def deco(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(**options: Any) -> None:
            from infera.clikit import run_guarded

            bench = getattr(importlib.import_module(f"infera.bench.{module}"), function)
            code = run_guarded(bench, **options)
            if status:
                raise typer.Exit(code or 0)

        return run

    return deco


@bench_app.command("arena")
@runs("arena", "run_arena_bench")
def arena(
    chunk_size: str = typer.Option("4M", "--chunk-size", help="Chunk size for the put+get test."),
    rounds: int = typer.Option(200, "--rounds", help="Chunks put and got in the throughput test."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    index_chunks: int = typer.Option(100_000, "--index-chunks", help="Chunks indexed for the memory figure."),
) -> None:
    """The RAM tier through the daemon vs memcpy; LOOKUP/GET latency; daemon memory per 100k chunks."""


@bench_app.command("disk")
@runs("disk", "run_disk_bench")
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


@bench_app.command("top-render")
@runs("top_render", "run_top_render_bench")
def top_render(
    clients: int = typer.Option(
        200, "--clients", help="Clients in the STATS reply (rows of the client table)."
    ),
    history: int = typer.Option(10_000, "--history", help="Points in each sparkline series."),
    frames: int = typer.Option(20, "--frames", help="Frames measured (after 3 warm-up frames)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """`kvd top` frame render time vs its 50 ms budget and vs an empty frame."""


@bench_app.command("l4")
@runs("l4", "run_l4_bench", status=True)
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


@bench_app.command("ttft")
@runs("ttft", "run_ttft_bench")
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


@bench_app.command("compare")
@runs("compare", "run_compare", status=True)
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


@bench_app.command("transfer")
@runs("transfer", "run_transfer_bench")
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
    device_name: str = typer.Option("cuda", "--device", help="cuda, or cpu for a dry run of the code paths."),
    staging_mib: int = typer.Option(768, "--staging-mib", help="GPU staging (INFERA_KVD_GPU_STAGING_MB)."),
    kernels: str = typer.Option(
        "auto",
        "--kernels",
        help="INFERA_KVD_COPY_KERNEL values to run (auto, triton, torch); auto,torch compares them.",
    ),
) -> None:
    """GPU KV <-> daemon arena through the worker's real save/load code, vs the pinned copy ceiling."""


@bench_app.command("gpu-e2e")
@runs("gpu_e2e", "run_gpu_e2e")
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
    sweep: str = typer.Option(
        "",
        "--sweep",
        help="More prompt lengths for the Llama rows, and a plot of TTFT against length "
        "(ttft_vs_length.png); 'default' is 512,1024,2048,4096,8192,16384. Off unless given.",
    ),
    partial: str = typer.Option(
        "1024,4096",
        "--partial",
        help="New tokens after the largest cached Llama prompt (multi-turn partial hits); empty for none.",
    ),
    load_policy: str = typer.Option(
        DEFAULT_POLICY,
        "--load-policy",
        help="INFERA_KVD_LOAD_POLICY of the kvd engines: always, auto or never.",
    ),
    layerwise: bool = typer.Option(
        False,
        "--layerwise/--no-layerwise",
        help="INFERA_KVD_LOAD_LAYERWISE of the kvd engines: load each layer's KV just before it runs.",
    ),
    cuda_graphs: bool = typer.Option(
        False,
        "--cuda-graphs/--enforce-eager",
        help="Every engine with vLLM's default CUDA graphs and torch.compile (slower starts) "
        "instead of enforce_eager.",
    ),
) -> None:
    """TTFT on a GPU with vLLM: recompute, vLLM native CPU hit, kvd RAM/cross-engine/disk hits, GPU hit."""


@bench_app.command("scale")
@runs("scale", "run_scale_bench")
def scale(
    quick: bool = typer.Option(
        False, "--quick", help="Small sizes (well under a minute; what the CPU test runs)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
    out: str = typer.Option(
        "kvd-bench-scale", "--out", help="Directory for results.json, scale.md and the log-scale plots."
    ),
    only: str = typer.Option("", "--only", help="Parts: index, restart, concurrency, namespaces, cpu."),
    restart_files: str = typer.Option("", "--restart-files", help="Restart part's file counts: 1000000,..."),
) -> None:
    """How cost grows: 10k to 1M chunks, restart with 1M files, 1 to 16 clients, namespaces, CPU."""


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
