"""Our log lines inside a vLLM process go through vLLM's handlers, once, and only when vLLM has
handlers: one helper for the connector and the P/D registration (infera.engine.vllm.hookup)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from infera.engine.vllm.hookup import adopt_vllm_logging


@pytest.fixture
def vllm_handler() -> Iterator[logging.Handler]:
    theirs = logging.getLogger("vllm")
    saved = (list(theirs.handlers), theirs.level)
    handler = logging.StreamHandler()
    theirs.handlers[:] = [handler]
    theirs.setLevel(logging.WARNING)
    names = ("infera.test.hookup.a", "infera.test.hookup.b")
    yield handler
    theirs.handlers[:] = saved[0]
    theirs.setLevel(saved[1])
    for name in names:
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.setLevel(logging.NOTSET)


def test_adopts_vllms_handlers_and_level_once(vllm_handler: logging.Handler) -> None:
    adopt_vllm_logging("infera.test.hookup.a")
    a = logging.getLogger("infera.test.hookup.a")
    assert a.handlers == [vllm_handler] and not a.propagate and a.level == logging.WARNING
    adopt_vllm_logging("infera.test.hookup.a")  # again: no second handler, no duplicate lines
    assert a.handlers == [vllm_handler]
    adopt_vllm_logging("infera.test.hookup.b", level=logging.INFO)  # the registration's INFO lines
    assert logging.getLogger("infera.test.hookup.b").level == logging.INFO


def test_without_vllm_handlers_nothing_changes() -> None:
    theirs = logging.getLogger("vllm")
    saved = list(theirs.handlers)
    theirs.handlers.clear()
    try:
        adopt_vllm_logging("infera.test.hookup.c")
        c = logging.getLogger("infera.test.hookup.c")
        assert c.handlers == [] and c.propagate
    finally:
        theirs.handlers[:] = saved
