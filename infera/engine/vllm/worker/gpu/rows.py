"""Strided copies of rows: ``height`` rows of ``width`` bytes, ``spitch`` apart in the source and
``dpitch`` apart in the destination, as one copy.

A layer-wise load moves one layer of many chunks at a time. In the arena a chunk is
``[layer][block][page]``, so one layer of a run of neighbouring chunks is a row per chunk at the
chunk's stride: one 2D DMA (``cudaMemcpy2DAsync``, ``hipMemcpy2DAsync`` on ROCm) per run and
layer, where torch's own ``copy_`` of a strided host tensor would first gather it on the CPU.

The runtime library is the one already loaded into this process (found in ``/proc/self/maps``),
so the copy runs in the same context and on the same streams as torch's. Where it cannot be found
:func:`row_copier` returns None and the reason; on CPU tensors (tests, dry runs) the same rows are
copied with torch. Every call checks that the rows stay inside both tensors before a byte moves.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

H2D = 1  # cudaMemcpyHostToDevice == hipMemcpyHostToDevice
_LIBS = (("libcudart.so", "cudaMemcpy2DAsync"), ("libamdhip64.so", "hipMemcpy2DAsync"))

RowCopy = Callable[[torch.Tensor, int, int, torch.Tensor, int, int, int, int, Any], None]


class RowCopyError(RuntimeError):
    """A strided copy that would leave a tensor, or that the runtime refused."""


def check_rows(t: torch.Tensor, lo: int, pitch: int, width: int, height: int, what: str) -> None:
    if lo < 0 or width <= 0 or height <= 0 or pitch < width:
        raise RowCopyError(f"{what}: bad rows (offset {lo}, pitch {pitch}, width {width}, {height} rows)")
    if lo + (height - 1) * pitch + width > t.numel():
        raise RowCopyError(f"{what}: {height} rows of {width} bytes at {lo} leave its {t.numel()} bytes")


def _checked(copy: RowCopy) -> RowCopy:
    """``copy`` behind the bounds checks of both sides (every row copy goes through this)."""

    def rows(
        dst: torch.Tensor,
        dlo: int,
        dpitch: int,
        src: torch.Tensor,
        slo: int,
        spitch: int,
        width: int,
        height: int,
        stream: Any,
    ) -> None:
        check_rows(dst, dlo, dpitch, width, height, "destination")
        check_rows(src, slo, spitch, width, height, "source")
        copy(dst, dlo, dpitch, src, slo, spitch, width, height, stream)

    return rows


def _torch_copy(
    dst: torch.Tensor,
    dlo: int,
    dpitch: int,
    src: torch.Tensor,
    slo: int,
    spitch: int,
    width: int,
    height: int,
    stream: Any,
) -> None:
    d = dst.as_strided((height, width), (dpitch, 1), dst.storage_offset() + dlo)
    d.copy_(src.as_strided((height, width), (spitch, 1), src.storage_offset() + slo))


torch_rows = _checked(_torch_copy)  # CPU tensors: the same arithmetic as the 2D DMA


def _loaded_runtime() -> tuple[str, str] | None:
    """(path, function) of the GPU runtime library this process has loaded."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    return pick_runtime(maps, torch.version.cuda or getattr(torch.version, "hip", None))


def pick_runtime(maps: str, version: str | None) -> tuple[str, str] | None:
    """(path, function) of the runtime library in ``maps`` (the text of ``/proc/PID/maps``) that
    torch's own runtime ``version`` (``torch.version.cuda`` or ``.hip``, e.g. ``13.0``) names.

    A process may have two loaded (torch's ``libcudart.so.13`` and, say, a ``libcudart.so.12``
    another package brought): the copy must run in torch's, the one whose major version torch was
    built with. Without a version to go by, or no library of that major version, the first by
    path (the only one, usually)."""
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "/" in line})
    major = version.split(".", 1)[0] if version else None
    for stem, fn in _LIBS:
        found = [p for p in paths if p.rsplit("/", 1)[-1].startswith(stem)]
        same = [p for p in found if major and p.rsplit("/", 1)[-1].startswith(f"{stem}.{major}")]
        if same or found:
            return (same or found)[0], fn
    return None


def row_copier(device: torch.device) -> tuple[RowCopy | None, str]:
    """The row copy for ``device``'s tensors, or None and why there is none."""
    if device.type == "cpu":
        return torch_rows, "torch rows (CPU tensors)"
    found = _loaded_runtime()
    if found is None:
        return None, "no CUDA or HIP runtime library is loaded in this process"
    path, name = found
    try:
        fn = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError) as exc:
        return None, f"{name} not found in {path}: {exc}"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    fn.argtypes += [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def dma_copy(
        dst: torch.Tensor,
        dlo: int,
        dpitch: int,
        src: torch.Tensor,
        slo: int,
        spitch: int,
        width: int,
        height: int,
        stream: Any,
    ) -> None:
        code = fn(
            dst.data_ptr() + dlo, dpitch, src.data_ptr() + slo, spitch, width, height, H2D, stream.cuda_stream
        )
        if code != 0:
            raise RowCopyError(f"{name} failed with error {code}")

    return _checked(dma_copy), f"{name} ({path.rsplit('/', 1)[-1]})"
