"""Layer-wise loads on CPU tensors: each layer's pages land only when that layer is waited for,
exactly as a whole-chunk scatter would write them; layers vLLM never asked for are copied at the
end; the leases are released once; a bad chunk is refused before anything is deferred."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from infera.engine.vllm.worker.layerwise import LayerwiseLoads
from infera.engine.vllm.worker.layout import KVLayout, LayoutError

NB = 12
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(3)]


def caches(seed: int | None) -> dict[str, torch.Tensor]:
    """Three layers of 12 blocks ([block, 2, 16 tokens, 4]); zeros without a seed."""
    g = torch.Generator().manual_seed(seed or 0)
    out = {}
    for n in NAMES:
        t = torch.randn(NB, 2, 16, 4, generator=g).to(torch.bfloat16)
        out[n] = t if seed is not None else torch.zeros_like(t)
    return out


def test_each_layer_lands_when_it_is_waited_for() -> None:
    src, dst = caches(1), caches(None)
    src_layout, dst_layout = KVLayout.from_caches(src), KVLayout.from_caches(dst)
    ids = [3, 4, 9, 10]  # two runs of consecutive blocks
    payload = torch.empty(src_layout.chunk_bytes(4), dtype=torch.uint8)
    src_layout.gather(ids, payload)
    want = caches(None)
    KVLayout.from_caches(want).scatter([5, 6, 7, 1], payload, skip=1, stop=4)  # the reference

    released: list[int] = []
    failed: list[list[int]] = []
    counters: Counter[str] = Counter()
    lw = LayerwiseLoads(dst_layout, counters, on_failed=failed.append)
    lw.add([5, 6, 7, 1], payload, 1, 4)
    lw.started(lambda: released.append(1))
    assert lw.active and all(not dst[n].any() for n in NAMES)  # nothing copied before a layer runs
    lw.wait(NAMES[1])
    assert torch.equal(dst[NAMES[1]], want[NAMES[1]])
    assert not dst[NAMES[0]].any() and not dst[NAMES[2]].any()
    lw.wait(NAMES[1])  # twice: no second copy
    lw.wait("not.a.layer")
    lw.wait(NAMES[0])
    assert torch.equal(dst[NAMES[0]], want[NAMES[0]]) and not dst[NAMES[2]].any()
    assert released == [] and counters["load_layerwise_waits"] == 2 and not failed
    lw.finish()  # the step ends: the layer vLLM did not ask for is copied too
    assert all(torch.equal(dst[n], want[n]) for n in NAMES)
    assert released == [1] and counters["load_layerwise_late_layers"] == 1
    assert failed == [[6, 7, 1]], "a layer run without waiting may have read stale KV: recompute"
    assert not lw.active
    assert not dst[NAMES[0]][5].any(), "block 5 was skipped (the engine had it)"


def test_the_last_waited_layer_releases_the_leases() -> None:
    dst = caches(None)
    layout = KVLayout.from_caches(dst)
    released: list[int] = []
    failed: list[list[int]] = []
    lw = LayerwiseLoads(layout, Counter(), on_failed=failed.append)
    lw.add([2], torch.ones(layout.chunk_bytes(1), dtype=torch.uint8), 0, None)
    lw.started(lambda: released.append(1))
    for n in NAMES:
        lw.wait(n)
    assert released == [1] and not lw.active and not failed


def test_a_bad_chunk_is_refused_before_it_is_deferred() -> None:
    layout = KVLayout.from_caches(caches(None))
    with pytest.raises(LayoutError, match="payload"):
        layout.check_chunk([1, 2], torch.zeros(layout.chunk_bytes(1), dtype=torch.uint8), 0, None)
    with pytest.raises(LayoutError, match="block id"):
        layout.check_chunk([NB], torch.zeros(layout.chunk_bytes(1), dtype=torch.uint8), 0, None)


def test_a_failed_copy_becomes_load_errors() -> None:
    layout = KVLayout.from_caches(caches(None))
    failed: list[list[int]] = []
    released: list[int] = []
    lw = LayerwiseLoads(layout, Counter(), on_failed=failed.append)
    lw.add([1, 2], torch.zeros(layout.chunk_bytes(2), dtype=torch.uint8), 0, None)
    lw.pending[0] = ([1, 2], torch.zeros(3, dtype=torch.uint8), 0, None)  # corrupted after the check
    lw.started(lambda: released.append(1))
    lw.finish()
    assert failed == [[1, 2]] and released == [1] and not lw.active


@pytest.mark.parametrize(("value", "piecewise"), [(None, False), ("0", False), ("1", True), ("maybe", True)])
def test_layerwise_loads_keep_vllms_cuda_graphs_piecewise(
    monkeypatch: pytest.MonkeyPatch, value: str | None, piecewise: bool
) -> None:
    """vLLM asks the connector class, through its own factory and before any engine exists,
    whether full CUDA graphs are safe: a full graph's replay never calls wait_for_layer_load, so
    with layer-wise loads every layer would be late (and recomputed). A value the connector will
    refuse answers yes, the safe side."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from infera.engine.vllm.kvd_connector import InferaKvdConnector

    assert hasattr(KVConnectorBase_V1, "requires_piecewise_for_cudagraph"), "vLLM's hook moved"
    if value is None:
        monkeypatch.delenv("INFERA_KVD_LOAD_LAYERWISE", raising=False)
    else:
        monkeypatch.setenv("INFERA_KVD_LOAD_LAYERWISE", value)
    ktc = KVTransferConfig(
        kv_connector="InferaKvdConnector",
        kv_role="kv_both",
        kv_connector_module_path="infera.engine.vllm.kvd_connector",
    )
    cls = KVConnectorFactory.get_connector_class(ktc)
    assert cls is InferaKvdConnector
    assert cls.requires_piecewise_for_cudagraph(ktc.kv_connector_extra_config) is piecewise
