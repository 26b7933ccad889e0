"""The protocol's tables are the daemon's: every op has its handler, every error code it sends is listed."""

from __future__ import annotations

import ast
from pathlib import Path

from infera.kvd import protocol as P

KVD = Path(__file__).resolve().parents[2] / "infera" / "kvd"


def _sent_error_codes() -> set[str]:
    """String codes the daemon puts in replies: ``BadRequest(msg, "code")`` and ``{"error": "code"}``."""
    codes: set[str] = set()
    for path in KVD.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "BadRequest"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
            ):
                codes.add(node.args[1].value)
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "error" and isinstance(v, ast.Constant):
                        codes.add(v.value)
    return codes


def test_every_op_has_a_handler_and_nothing_else_is_served() -> None:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.server import Server

    server = Server(DaemonConfig(socket="/nonexistent/kvd.sock"))
    assert list(server.handlers) == list(P.OPS)


def test_every_error_code_the_daemon_sends_is_in_the_table() -> None:
    sent = _sent_error_codes() | {"bad_request"}  # BadRequest's default code
    assert sent, "found no error codes: the scan is broken"
    assert sent <= set(P.ERROR_CODES), sorted(sent - set(P.ERROR_CODES))
    # codes that are per-key PUT slot results rather than reply errors are listed too
    unused = set(P.ERROR_CODES) - sent - {"full", "busy", "exists", "quota"}
    assert not unused, f"listed but never sent: {sorted(unused)}"
