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


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
