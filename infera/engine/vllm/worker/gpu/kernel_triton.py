"""The Triton source of the page-copy kernel (see :mod:`infera.engine.vllm.worker.gpu.kernel`).

Kept apart, without ``from __future__ import annotations`` and without type annotations on the
kernel's parameters: Triton compiles the function from its source and resolves every name in it
(annotations included) as a global of this module. Imported only when the kernel is built.
"""

import triton
import triton.language as tl


@triton.jit
def page_copy(
    ptrs,
    strides,
    offs,
    pages,
    blocks,
    slots,
    buf,
    bpc,
    chunk_elems,
    TO_BUF: tl.constexpr,
    BLOCK: tl.constexpr,
):  # type: ignore[no-untyped-def]
    # program (k, layer): page `layer` of KV block blocks[k] <-> staging slot slots[k]
    k = tl.program_id(0)
    layer = tl.program_id(1)
    block = tl.load(blocks + k)
    slot = tl.load(slots + k)
    page = tl.load(pages + layer)
    base = tl.load(ptrs + layer).to(tl.pointer_type(buf.dtype.element_ty))
    kv = base + block * tl.load(strides + layer)
    staged = buf + (slot // bpc) * chunk_elems + tl.load(offs + layer) + (slot % bpc) * page
    for start in range(0, page, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < page
        if TO_BUF:
            tl.store(staged + cols, tl.load(kv + cols, mask=mask), mask=mask)
        else:
            tl.store(kv + cols, tl.load(staged + cols, mask=mask), mask=mask)
