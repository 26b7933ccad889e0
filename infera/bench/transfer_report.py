"""The output of ``kvd bench transfer``: one line per row (printed as each row finishes) and the
table of a whole run."""

from __future__ import annotations

from typing import Any

HEAD = (
    f"{'model':<26} {'dtype':<5} {'vLLM':<5} {'copy':<6} {'chunk':>7} {'save GB/s':>9} {'x ceil':>6} "
    f"{'load GB/s':>9} {'x ceil':>6} {'cpu us/chunk s/l':>16}  ok  path"
)


def line(r: dict[str, Any]) -> str:
    size = r["chunk_bytes"] / (1 << 20)  # MiB
    path = r["data_path"] or "?"
    if r.get("fallback"):
        path += f" (fallback: {str(r.get('fallback_reason'))[:70]})"
    return (
        f"{r['model']:<26} {r['dtype']:<5} {r['layout']:<5} {r['kernel']:<6} {size:>5.1f}Mi {r['save_gbps']:>9.1f} "
        f"{r['save_ratio']:>6.2f} {r['load_gbps']:>9.1f} {r['load_ratio']:>6.2f} "
        f"{r['save_cpu_us_per_chunk']:>7.0f}/{r['load_cpu_us_per_chunk']:<8.0f} "
        f"{'yes' if r['verified'] else 'NO '}  {path}"
    )


def table(out: dict[str, Any]) -> str:
    lines = [
        f"pinned ceiling: H2D {out['ceiling_h2d_gbps']:.1f} GB/s, D2H {out['ceiling_d2h_gbps']:.1f} GB/s; "
        f"{out['tokens']} tokens per round",
        HEAD,
    ]
    lines += [line(r) for r in out["rows"]]
    return "\n".join(lines)
