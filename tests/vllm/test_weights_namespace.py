"""New weights under the same model path start a new namespace (docs/namespace.md): real engines.

Engine A stores a prompt; engine B, a fresh process on the same weights, hits it (the control);
then ``model.safetensors`` is rewritten in place with other values of the same shapes, as an RL
checkpoint or a hot fix would, and engine C, on the same path, must get no hit on the old KV.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import EngineRun, prompt, run_engine

from helpers import Daemon

P1 = prompt(11, 1000)  # 3 whole 256-token chunks
CHUNK = 256


@pytest.fixture(scope="module")
def model_dir(tiny_model: str, module_tmp: Path) -> Path:
    """A copy of the tiny model this module may rewrite."""
    d = module_tmp / "model"
    shutil.copytree(tiny_model, d)
    return d


@pytest.fixture(scope="module")
def kvd(module_tmp: Path) -> Iterator[Daemon]:
    d = Daemon(str(module_tmp / "kvd.sock"), ["--max-bytes", "64M"], module_tmp / "kvd.log").start()
    yield d
    d.stop()


def _steps() -> list[dict[str, Any]]:
    return [
        {"op": "generate", "name": "p1", "prompt": P1},
        {"op": "keys", "name": "keys", "prompt": P1},
        {"op": "statctl", "name": "stats"},
    ]


def _rewrite_weights(model: Path) -> None:
    """Other values, same names, shapes and dtypes: the file keeps its size."""
    import torch
    from safetensors.torch import load_file, save_file

    path = model / "model.safetensors"
    size = path.stat().st_size
    tensors = load_file(str(path))
    g = torch.Generator().manual_seed(7)
    new = {k: (torch.randn(v.shape, generator=g) * 0.2).to(v.dtype) for k, v in tensors.items()}
    save_file(new, str(path), metadata={"format": "pt"})
    assert path.stat().st_size == size


@pytest.fixture(scope="module")
def runs(model_dir: Path, kvd: Daemon, module_tmp: Path) -> dict[str, EngineRun]:
    out = {}
    out["a"] = run_engine(str(model_dir), _steps(), socket=kvd.socket, workdir=module_tmp)
    out["b"] = run_engine(str(model_dir), _steps(), socket=kvd.socket, workdir=module_tmp)
    _rewrite_weights(model_dir)
    out["c"] = run_engine(str(model_dir), _steps(), socket=kvd.socket, workdir=module_tmp)
    return out


def test_same_weights_share_the_namespace_and_hit(runs: dict[str, EngineRun]) -> None:
    a, b = runs["a"], runs["b"]
    assert a["keys"]["namespace"] == b["keys"]["namespace"]
    assert "/w:" in a["keys"]["namespace"]
    assert b["p1"]["external_hits"] == 3 * CHUNK, "the control: a fresh engine on the same weights hits"
    assert b["p1"]["tokens"] == a["p1"]["tokens"]


def test_rewritten_weights_start_a_new_namespace_and_miss(runs: dict[str, EngineRun]) -> None:
    a, c = runs["a"], runs["c"]
    old, new = a["keys"]["namespace"], c["keys"]["namespace"]
    assert new != old
    assert new.split("/")[:2] == old.split("/")[:2], "same model directory"
    assert new.split("/")[2] != old.split("/")[2], "the name shows other weights"
    assert c["p1"]["external_hits"] == 0, "no hit on the KV the old weights computed"
    assert c["keys"]["present"] == 3, "the new weights' chunks were stored under the new namespace"
    assert c["p1"]["tokens"] != a["p1"]["tokens"], "the new weights really compute something else"


def test_the_connector_logs_the_weights(runs: dict[str, EngineRun]) -> None:
    ns = runs["c"]["keys"]["namespace"]
    short = ns.split("/")[2][2:]
    assert f"weights {short}" in runs["c"].log


def test_kvd_stat_shows_the_weights_of_each_engine(runs: dict[str, EngineRun]) -> None:
    """``kvd stat --json`` (what ``kvd top`` reads) names the namespace, weights tag included."""
    c = runs["c"]
    engines = [cl for cl in c["stats"]["stats"]["clients"] if cl["role"].startswith("vllm-")]
    assert engines and {cl["namespace"] for cl in engines} == {c["keys"]["namespace"]}
    assert all("/w:" in cl["namespace"] for cl in engines)
