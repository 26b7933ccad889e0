"""``python -m infera.kvd --socket PATH --max-bytes 16G ...``: run the daemon."""

from __future__ import annotations

import typer

from infera.kvd.cli import serve


def main() -> None:
    typer.run(serve)


if __name__ == "__main__":
    main()
