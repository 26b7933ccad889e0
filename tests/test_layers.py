"""The layer rules of docs/design.md ("Layers"), held against every import in the tree.

Every module of ``infera`` (with ``doctor/`` and ``launch/`` as ``infera.doctor`` and
``infera.launch``) is parsed with :mod:`ast`; every import counts: module level, inside functions
(lazy) and under ``if TYPE_CHECKING:``. A type-only import is still a dependency of the design (it
is what draws the tiers above the server), so it needs the same permission as a real one.

Each module belongs to one layer (:data:`LAYERS`); an import between layers must be an allowed edge
(:data:`MAY_IMPORT`). The known breaks are listed in :data:`KNOWN_BREAKS` with the issue that removes
them; the list can only shrink: an entry whose import is gone fails the test until it is deleted.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Where each package's sources are (doctor/ and launch/ install as infera.doctor and infera.launch).
ROOTS = {"infera": REPO / "infera", "infera.doctor": REPO / "doctor", "infera.launch": REPO / "launch"}

#: Module -> layer. ``name`` is that module; ``name.*`` everything below it. The longest match wins.
LAYERS: dict[str, str] = {
    # contract: what every process shares; imports nothing of ours but itself
    "infera": "contract",  # the package: __version__
    "infera.errors": "contract",
    "infera.clikit": "contract",  # how a KvdError is shown and what exit status it gives
    "infera.units": "contract",
    "infera.display": "contract",  # what a daemon sent, on a terminal: escaped, tolerant of odd types
    "infera.versions": "contract",
    "infera.keyrules": "contract",  # the one table of key rules tools and connector share
    # the connector's INFERA_KVD_* settings: the connector, its entry point and kvd lint parse them alike
    "infera.engine.vllm.config": "contract",
    "infera.kvlayout": "contract",  # the kv_layout an engine declares at HELLO, rendered per namespace
    "infera.loadreport": "contract",  # the load policy's counters an engine REPORTs, rendered
    "infera.kvd.protocol": "contract",  # frames, HELLO, default socket path, arena mapping
    "infera.kvd.client": "contract",
    "infera.kvd.clientarena": "contract",  # the client's reads and writes through the arena
    "infera.kvd.clientnet": "contract",  # connecting to a daemon one trusts; the client errors
    "infera.kvd.clientwire": "contract",  # the client's frames and replies
    "infera.kvd.populate": "contract",  # a mapping of the arena populated (client, and --prefault)
    "infera.kvd.chunkfile": "contract",
    "infera.kvd.chunkfile.*": "contract",
    "infera.discovery": "contract",  # the P/D worker record, its etcd client and registrar
    "infera.discovery.*": "contract",
    # the shared table of daemon flags: `kvd serve`, launch, lint and doctor derive from it
    "infera.kvd.flags": "contract",
    "infera.kvd.flags.*": "contract",
    "infera.kvd.flagopts": "contract",  # the table as Typer options
    "infera.kvd.process": "contract",  # start a daemon process and wait for it (demo, bench, tests)
    # daemon: the runtime behind the socket
    "infera.kvd.*": "daemon",
    # connector: the vLLM halves, layouts, keys, GPU path, engine entry
    "infera.engine": "connector",
    "infera.engine.*": "connector",
    # tools: each its own unit (see TOOL_UNITS)
    "infera.doctor": "tools",
    "infera.doctor.*": "tools",
    "infera.launch": "tools",
    "infera.launch.*": "tools",
    "infera.tui": "tools",
    "infera.tui.*": "tools",
    "infera.kvd.statctl": "tools",
    "infera.kvd.demo": "tools",
    "infera.discovery.docgen": "tools",
    # bench: anything
    "infera.bench": "bench",
    "infera.bench.*": "bench",
    # app: command surfaces that assemble every package's commands (lazily); anything
    "infera.cli": "app",
    "infera.kvd.cli": "app",
    "infera.kvd.__main__": "app",
}

MAY_IMPORT: dict[str, set[str]] = {
    "contract": {"contract"},
    "daemon": {"contract", "daemon"},
    "connector": {"contract", "connector"},
    "tools": {"contract", "tools"},  # and within tools only the same unit, see TOOL_UNITS
    "bench": {"contract", "daemon", "connector", "tools", "bench", "app"},
    "app": {"contract", "daemon", "connector", "tools", "bench", "app"},
}

#: A tool imports contract and itself, not another tool.
TOOL_UNITS = (
    "infera.doctor",
    "infera.launch",
    "infera.tui",
    "infera.kvd.statctl",
    "infera.kvd.demo",
    "infera.discovery.docgen",
)

#: Inside the daemon the server is on top: nothing below it holds it.
DAEMON_TOP = ("infera.kvd.server", "infera.kvd.ops", "infera.kvd.daemon")

#: (importer, imported, how) -> why it is still there and what removes it. May only shrink.
KNOWN_BREAKS: dict[tuple[str, str, str], str] = {}

#: Third-party imports some layers must never make. "lazy" ones (inside a function) are allowed
#: where the value is True: launch imports vllm.config.KVTransferConfig only under --vllm.
NEVER_IMPORT: dict[str, dict[str, bool]] = {
    "contract": {"vllm": False, "torch": False},
    "daemon": {"vllm": False, "torch": False},
    "tools": {"vllm": True, "torch": False},
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str  # an infera module, or a third-party top-level name
    how: str  # "top" (runs at import), "lazy" (inside a function), "type" (under TYPE_CHECKING)
    line: int

    def __str__(self) -> str:
        return f"{self.src}:{self.line} -> {self.dst} ({self.how})"


@cache
def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg, base in ROOTS.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if pkg == "infera" and rel.parts[0] in ("doctor", "launch", "templates"):
                continue  # the symbolic links to doctor/, launch/ and templates/
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(mod: str, path: Path) -> Iterator[Edge]:
    mods = modules()
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

    def target(base: str, name: str) -> str:
        full = f"{base}.{name}" if base else name
        return full if full in mods else base

    def visit(node: ast.AST, how: str) -> Iterator[Edge]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, "type")
            for child in node.orelse:
                yield from visit(child, how)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and how == "top":
            how = "lazy"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(mod, alias.name, how, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                yield Edge(mod, target(base, alias.name), how, node.lineno)
        for child in ast.iter_child_nodes(node):
            yield from visit(child, how)

    yield from visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "top")


@cache
def edges() -> tuple[Edge, ...]:
    return tuple(dict.fromkeys(e for mod, path in modules().items() for e in _imports(mod, path)))


def ours(name: str) -> bool:
    return name == "infera" or name.startswith("infera.")


def layer_of(mod: str) -> str | None:
    best, layer = -1, None
    for pattern, lay in LAYERS.items():
        if pattern.endswith(".*"):
            prefix = pattern[:-2]
            hit = mod.startswith(prefix + ".")
            size = len(prefix) + 1
        else:
            hit = mod == pattern
            size = len(pattern) + 2  # an exact name beats the package pattern of the same name
        if hit and size > best:
            best, layer = size, lay
    return layer


def unit_of(mod: str) -> str | None:
    return next((u for u in TOOL_UNITS if mod == u or mod.startswith(u + ".")), None)


def problem(e: Edge) -> str | None:
    """Why this import breaks a layer rule, or None."""
    src = layer_of(e.src)
    if not ours(e.dst):
        top = e.dst.split(".")[0]
        rule = NEVER_IMPORT.get(src or "", {})
        if top in rule and not (rule[top] and e.how == "lazy"):
            return f"the {src} layer never imports {top}" + (" at module level" if rule[top] else "")
        return None
    dst = layer_of(e.dst)
    assert src is not None and dst is not None, f"unmapped module in {e}"
    if dst not in MAY_IMPORT[src]:
        return f"{src} may not import {dst}"
    if src == dst == "tools" and unit_of(e.src) != unit_of(e.dst):
        return f"one tool ({unit_of(e.src)}) imports another ({unit_of(e.dst)})"
    if src == dst == "daemon" and e.dst in DAEMON_TOP and e.src not in DAEMON_TOP:
        return "below the server, nothing holds the server"
    if e.src.startswith("infera.launch") and e.dst == "infera.kvd.client":
        return "launch needs no running daemon"
    return None


def breaks() -> list[tuple[Edge, str]]:
    return [(e, why) for e in edges() if (why := problem(e)) is not None]


# --- the tests ---------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    unmapped = sorted(m for m in modules() if layer_of(m) is None)
    assert unmapped == [], f"give these modules a layer in LAYERS (and in docs/design.md): {unmapped}"


def test_every_import_of_ours_names_a_module_that_exists() -> None:
    mods = modules()
    missing = [str(e) for e in edges() if ours(e.dst) and e.dst not in mods]
    assert missing == []


def test_imports_follow_the_layer_rules() -> None:
    new = [f"{e}: {why}" for e, why in breaks() if (e.src, e.dst, e.how) not in KNOWN_BREAKS]
    assert new == [], "imports that break the layer rules of docs/design.md:\n" + "\n".join(new)


def test_known_breaks_only_shrink() -> None:
    seen = {(e.src, e.dst, e.how) for e in edges()}
    gone = [f"{k}: {why}" for k, why in KNOWN_BREAKS.items() if k not in seen]
    assert gone == [], "fixed, so delete these entries from KNOWN_BREAKS:\n" + "\n".join(gone)


def test_no_import_cycles_but_the_known_ones() -> None:
    graph: dict[str, set[str]] = {}
    for e in edges():
        if ours(e.dst) and e.dst != e.src and (e.src, e.dst, e.how) not in KNOWN_BREAKS:
            graph.setdefault(e.src, set()).add(e.dst)
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_checker_sees_lazy_and_type_only_imports() -> None:
    got = {(e.dst, e.how) for e in edges() if e.src == "infera.launch.ktc"}
    assert ("vllm.config", "lazy") in got
    got = {(e.dst, e.how) for e in edges() if e.src == "infera.kvd.ops"}
    assert ("infera.kvd.store", "type") in got and ("infera.kvd.protocol", "top") in got


def test_a_daemon_importing_torch_or_a_tool_importing_the_server_is_caught() -> None:
    assert problem(Edge("infera.kvd.store", "torch", "lazy", 1))
    assert problem(Edge("infera.kvd.tiers.disk", "vllm.config", "type", 1))
    assert problem(Edge("infera.launch.cli", "vllm", "top", 1))
    assert problem(Edge("infera.launch.cli", "vllm", "lazy", 1)) is None
    assert problem(Edge("infera.doctor.checks.daemon", "infera.kvd.server", "lazy", 1))
    assert problem(Edge("infera.tui.app", "infera.kvd.store", "type", 1))
    assert problem(Edge("infera.engine.vllm.worker", "infera.kvd.arena", "top", 1))
    assert problem(Edge("infera.engine.vllm.worker", "infera.doctor.run", "lazy", 1))
    assert problem(Edge("infera.kvd.protocol", "infera.kvd.config", "top", 1))
    assert problem(Edge("infera.doctor.checks.gpu", "infera.launch.rules", "top", 1))
    assert problem(Edge("infera.launch.build", "infera.kvd.client", "lazy", 1))
    assert problem(Edge("infera.doctor.facts.daemon", "infera.kvd.client", "lazy", 1)) is None


def _imported_by(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {m.split(".")[0] for m in out.split()}


def test_launch_and_lint_load_without_vllm_and_the_daemon_without_torch() -> None:
    """The static check at run time, catching imports ast cannot see (importlib, __import__)."""
    launch = _imported_by(
        "import infera.cli, infera.launch.cli, infera.launch.lint, infera.launch.lint.run, infera.launch.rules"
    )
    assert "vllm" not in launch and "torch" not in launch
    daemon = _imported_by("import infera.kvd.server, infera.kvd.tiers.disk, infera.kvd.tiers.remote")
    assert "vllm" not in daemon and "torch" not in daemon
