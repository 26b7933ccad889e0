"""Refresh the command output embedded in ``docs/pd.md`` from what ``kvd`` prints now.

A generated block is a ``console`` fence holding one ``$ kvd ...`` command (backslash line
continuations allowed), followed by a blank line and a fence with that command's output.
``python -m infera.discovery.docgen [PAGE]`` runs every such command and rewrites its output
block; ``tests/discovery/test_pd_docs.py`` fails while any block differs from the real output.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "pd.md"
BLOCK = re.compile(
    r"^```console\n\$ (?P<cmd>kvd (?:[^\n]*\\\n)*[^\n]*)\n```\n\n```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$",
    re.M | re.S,
)


@dataclass(frozen=True)
class Block:
    command: str
    body: str
    start: int
    end: int

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command.replace("\\\n", " "))


def blocks(text: str) -> list[Block]:
    return [Block(m["cmd"], m["body"], m.start("body"), m.end("body")) for m in BLOCK.finditer(text)]


def run_kvd(argv: list[str]) -> str:
    """What ``kvd ARGS`` prints on stdout, ending in one newline; raises on a non-zero exit."""
    if not argv or argv[0] != "kvd":
        raise ValueError(f"not a kvd command: {argv}")
    proc = subprocess.run(
        [sys.executable, "-c", "from infera.cli import main; main()", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited with {proc.returncode}:\n{proc.stderr}")
    return proc.stdout.rstrip("\n") + "\n"


def refresh(text: str) -> str:
    """``text`` with every generated block's output replaced by the command's output now."""
    out, pos = [], 0
    for b in blocks(text):
        out += [text[pos : b.start], run_kvd(b.argv)]
        pos = b.end
    return "".join(out) + text[pos:]


def main(argv: list[str]) -> int:
    page = Path(argv[0]) if argv else PAGE
    text = page.read_text(encoding="utf-8")
    new = refresh(text)
    page.write_text(new, encoding="utf-8")
    print(f"{page}: {len(blocks(text))} blocks, {'changed' if new != text else 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
