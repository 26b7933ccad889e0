"""``kvd bench gpu-e2e``: time to first token on a real GPU with real vLLM, kvd against vLLM's own
CPU offloading, all measured in one run.

Rows, per prompt length (default 4k and 16k tokens), for a Llama-3.1-8B-shaped model with dummy
weights in bf16, and (``--gemma3-sizes``, default 16k) for a Gemma-3-12B-shaped one, the hybrid
row set: five 1,024-token sliding-window layers per global one, vLLM's hybrid KV cache manager on
for both connectors (each engine reports it; the summary says so per role), no disk rows:

| row | how |
|---|---|
| recompute | kvd engine, retention ``none`` (nothing loaded or stored), GPU prefix cache reset |
| vLLM native CPU hit | ``OffloadingConnector`` (``cpu_bytes_to_use``), GPU prefix cache reset |
| kvd RAM hit, same engine | ``InferaKvdConnector``, GPU prefix cache reset |
| kvd RAM hit, other engine | a second engine process started after the first stored the prompt |
| kvd disk hit | the daemon restarted (RAM empty), page cache dropped, chunks read from disk |
| warm GPU prefix hit | the floor |

Each row is the median of ``--repeat`` requests, after one warm-up GPU hit per process. Ratios are
to recompute and to the native CPU hit; the effective load bandwidth of a hit is the KV bytes it
loaded over its TTFT minus the warm-hit TTFT, next to the pinned host-to-device ceiling measured
at the start of the run, and the worker's own DMA rate.

Correctness: the same processes first run a small Llama and a small Gemma-3-style model (a
200-token window, so chunks store only the window's tail of the sliding groups) with real
(random-initialised, saved) weights, greedy, several output tokens: every hit case must give
recompute's tokens.

Processes: ``native`` (one engine per model), ``kvd-a`` (stores, same-engine hits), ``kvd-b``
(cross-engine hits; then the orchestrator restarts the daemon and drops the page cache; then disk
hits). ``--small`` swaps the 8B config for a tiny one: a dry run of the whole script on a CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infera.errors import KvdError, UsageError
from infera.kvd.process import DaemonProcess

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "mlp_bias": False,
}
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
SMALL.update(num_key_value_heads=2, head_dim=32, vocab_size=4096)


#: Gemma-3-12B's text model (google/gemma-3-12b-it's text_config): 48 layers, 5 local (1,024-token
#: window) per global, 8 KV heads of 256. Built with the installed transformers' Gemma3TextConfig.
GEMMA3_12B = {
    "hidden_size": 3840,
    "intermediate_size": 15360,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "sliding_window": 1024,
    "query_pre_attn_scalar": 256,
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
}
GEMMA3_SMALL = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 200,
    "query_pre_attn_scalar": 32,
    "vocab_size": 4096,
    "max_position_embeddings": 32768,
}
SLIDING_PATTERN = 6


def _kv_bytes_per_token(cfg: dict[str, Any], elem: int = 2) -> int:
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * elem


def _hybrid_bytes(cfg: dict[str, Any], elem: int = 2) -> dict[str, Any]:
    """KV bytes per token of the global layers, of the sliding ones, and the window: a hit of n
    tokens loads n tokens of the first and min(n, window) of the second."""
    types = cfg.get("layer_types") or []
    n_sliding = sum(t == "sliding_attention" for t in types)
    per_layer = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * elem
    return {
        "bytes_per_token": (cfg["num_hidden_layers"] - n_sliding) * per_layer,
        "window_bytes_per_token": n_sliding * per_layer,
        "window": cfg["sliding_window"],
    }


def loaded_bytes(model: dict[str, Any], tokens: float) -> float:
    """KV bytes a hit of ``tokens`` tokens brings back (sliding layers: their window only)."""
    out = tokens * model["bytes_per_token"]
    if model.get("window"):
        out += min(tokens, model["window"]) * model.get("window_bytes_per_token", 0)
    return out


def build_gemma3_model(path: Path, dims: dict[str, Any], weights: bool = False) -> dict[str, Any]:
    """A Gemma-3-shaped text model (``Gemma3ForCausalLM``): its config (dummy weights) or, with
    ``weights``, random-initialised saved weights (the token check). The config comes from the
    installed transformers, so the file is in the format that version (and vLLM) reads."""
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(
        **dims,
        sliding_window_pattern=SLIDING_PATTERN,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        initializer_range=0.02,  # Gemma scales embeddings by sqrt(hidden): keep greedy output varied
        torch_dtype="bfloat16",
    )
    cfg.architectures = ["Gemma3ForCausalLM"]
    path.mkdir(parents=True, exist_ok=True)
    if weights:
        import torch
        from transformers import Gemma3ForCausalLM

        torch.manual_seed(0)
        Gemma3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    else:
        cfg.save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def build_timing_model(path: Path, small: bool) -> dict[str, Any]:
    cfg = dict(LLAMA_8B)
    if small:
        cfg.update(SMALL)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return cfg


def build_check_model(path: Path, small: bool) -> dict[str, Any]:
    """A small Llama with real (random-initialised, saved) weights: the token oracle."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
    if not small:
        dims = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8)
    cfg = LlamaConfig(
        **dims,
        num_key_value_heads=dims["num_attention_heads"],
        head_dim=64 if not small else 32,
        vocab_size=1000,
        max_position_embeddings=4096,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def drop_page_cache(root: Path) -> str:
    """Make the next reads come from the disk: drop_caches as root, else fadvise every file."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return f"fadvise DONTNEED on {n} files"


def run_engine(
    python: str,
    spec_path: Path,
    role: str,
    env: dict[str, str],
    logdir: Path,
    timeout: float,
    on_restart: Any = None,
) -> list[dict[str, Any]]:
    """One engine process; returns its RESULT/INFO/ERROR records (RESTART runs ``on_restart``)."""
    log = open(logdir / f"engine-{role}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [python, "-m", "infera.bench.gpu_e2e_engine", str(spec_path), role],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None and proc.stdin is not None
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            print(f"[{role}] {line[:300]}", file=sys.stderr, flush=True)
            kind, _, body = line.partition(" ")
            if kind == "RESTART":
                note = on_restart() if on_restart else "no restart"
                proc.stdin.write(f"GO {note}\n")
                proc.stdin.flush()
            elif kind in ("RESULT", "INFO", "ERROR", "WARN", "DONE"):
                try:
                    rec = json.loads(body)
                except json.JSONDecodeError:
                    continue
                rec["_kind"] = kind
                records.append(rec)
                with open(logdir / "records.jsonl", "a") as fh:  # survives a run cut short
                    fh.write(json.dumps(rec) + "\n")
            if time.monotonic() > deadline:
                raise KvdError(f"engine {role} ran past {timeout:.0f} s")
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    if not any(r["_kind"] == "DONE" for r in records):
        tail = (logdir / f"engine-{role}.log").read_text(errors="replace")[-1500:]
        records.append({"_kind": "ERROR", "role": role, "error": f"exit {proc.returncode}: {tail}"})
    return records


def _median(rows: list[dict[str, Any]], key: str = "ms") -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(
    records: list[dict[str, Any]], models: list[dict[str, Any]], ceiling: float | None
) -> dict[str, Any]:
    """Rows per model and size, ratios, bandwidth and the token check."""
    out: dict[str, Any] = {"models": []}
    by = {(r.get("model"), r.get("role"), r.get("tokens")): r for r in records if r["_kind"] == "RESULT"}
    for m in models:
        for n in m["sizes"]:
            a = by.get((m["name"], "kvd-a", n), {})
            nat = by.get((m["name"], "native", n), {})
            b = by.get((m["name"], "kvd-b", n), {})
            d = by.get((m["name"], "kvd-disk", n), {})
            warm = a.get("warm") or nat.get("warm") or []
            floor = _median(warm)
            cases = {
                "recompute": a.get("recompute") or [],
                "native CPU hit": nat.get("hit") or [],
                "kvd RAM hit, same engine": a.get("hit") or [],
                "kvd RAM hit, other engine": b.get("cross") or [],
                "kvd disk hit after restart": d.get("disk") or [],
                "warm GPU prefix hit": warm,
            }
            rec = _median(cases["recompute"])
            nat_ms = _median(cases["native CPU hit"])
            rows = []
            # a hit computes the prompt's tail from restored KV; so does a warm GPU hit from the
            # engine's own KV (same tail length when the prompt is k chunks + 1 token): equal
            # tokens mean the KV came back bit for bit. Recompute (a full prefill) can differ in
            # the last bits (other kernel shapes); it is shown, not required.
            ref = (a.get("warm") or nat.get("warm") or [{}])[0].get("tokens")
            disk_ref = [x.get("tokens") for x in a.get("disk_warm") or []]
            for name, samples in cases.items():
                ms = _median(samples)
                row: dict[str, Any] = {"case": name, "ms": ms, "n": len(samples)}
                row["vs_recompute"] = ms / rec if ms and rec else None
                row["vs_native"] = ms / nat_ms if ms and nat_ms else None
                if samples and name not in ("recompute", "warm GPU prefix hit"):
                    cached = statistics.median(s.get("cached", 0) for s in samples)
                    row["cached_tokens"] = cached
                    if ms and floor and ms > floor:
                        row["load_gbps"] = loaded_bytes(m, cached) / ((ms - floor) / 1000) / 1e9
                    dma = [s for s in samples if s.get("load_dma_us")]
                    if dma:
                        row["dma_gbps"] = statistics.median(
                            s["load_dma_bytes"] / s["load_dma_us"] / 1e3 for s in dma
                        )
                if samples and name != "recompute":
                    want = disk_ref if name.startswith("kvd disk") else [ref] * len(samples)
                    got = [s.get("tokens") for s in samples]
                    row["tokens_match"] = bool(ref) and all(
                        w is not None and g == w for g, w in zip(got, want, strict=False)
                    )
                if name == "recompute" and samples:
                    row["tokens_match"] = bool(ref) and all(s.get("tokens") == ref for s in samples)
                rows.append(row)
            hma = {
                r.get("role"): r.get("hma")
                for r in records
                if r["_kind"] == "INFO" and r.get("model") == m["name"] and "hma" in r
            }
            extra = {
                "hybrid_manager": hma or None,
                "native_store_ms": (nat.get("store") or {}).get("ms"),
                "kvd_store_ms": (a.get("store") or {}).get("ms"),
                "seal_wait_s": a.get("seal_wait_s"),
            }
            out["models"].append(
                {"model": m["name"], "tokens": n, "rows": rows, "ceiling_h2d_gbps": ceiling, **extra}
            )
    return out


def render(summary: dict[str, Any]) -> str:
    lines = []
    for block in summary["models"]:
        ceil = block.get("ceiling_h2d_gbps")
        head = f"{block['model']}, {block['tokens']} tokens"
        if ceil:
            head += f" (pinned H2D ceiling {ceil:.1f} GB/s)"
        lines.append(head)
        lines.append(
            f"  {'case':<28} {'TTFT ms':>8} {'/recomp':>8} {'/native':>8} {'GB/s>warm':>9} {'DMA GB/s':>8} tokens vs warm hit"
        )
        for r in block["rows"]:

            def f(v: Any, fmt: str) -> str:
                return format(v, fmt) if isinstance(v, int | float) else "-"

            match = {True: "same", False: "DIFFER", None: "-"}[r.get("tokens_match")]
            if r["case"] == "recompute" and r.get("tokens_match") is False:
                match = "differs*"
            lines.append(
                f"  {r['case']:<28} {f(r['ms'], '8.1f')} {f(r['vs_recompute'], '8.2f')} "
                f"{f(r['vs_native'], '8.2f')} {f(r.get('load_gbps'), '9.1f')} {f(r.get('dma_gbps'), '8.1f')} {match}"
            )
        if any(r["case"] == "recompute" and r.get("tokens_match") is False for r in block["rows"]):
            lines.append(
                "  * a full prefill computes the last token with other kernel shapes than a hit does; "
                "hits are checked against the warm GPU hit"
            )
        dma = [r["dma_gbps"] for r in block["rows"] if r.get("dma_gbps")]
        if dma and ceil:
            lines.append(
                f"  DMA GB/s: the worker's own load rate (CUDA events), {min(dma) / ceil:.2f} to "
                f"{max(dma) / ceil:.2f} of the ceiling; GB/s>warm: KV bytes over (TTFT - warm TTFT), "
                "above the link when the loads overlap the step's CPU work"
            )
        hma = block.get("hybrid_manager")
        if hma:
            lines.append(
                "  hybrid KV cache manager: "
                + ", ".join(f"{'on' if on else 'OFF'} for {role}" for role, on in sorted(hma.items()))
            )
        extras = [
            f"{k} {v:.1f}"
            for k, v in block.items()
            if k.endswith(("_ms", "_s")) and isinstance(v, int | float)
        ]
        if extras:
            lines.append("  " + ", ".join(extras))
    return "\n".join(lines)


def run_gpu_e2e(
    python: str | None = None,
    sizes: str = "4096,16384",
    repeat: int = 3,
    small: bool = False,
    check: bool = True,
    out: str | None = None,
    native_cpu_gb: float = 8.0,
    timeout: float = 420.0,
    json_out: bool = False,
    gemma3_sizes: str = "16384",
) -> dict[str, Any]:
    python = python or sys.executable
    lengths = _sizes("--sizes", sizes)
    if not lengths:
        raise UsageError("--sizes needs prompt lengths of at least 512 tokens")
    hybrid = _sizes("--gemma3-sizes", gemma3_sizes)
    workdir = Path(tempfile.mkdtemp(prefix="kvd-e2e-", dir="/tmp"))
    logdir = Path(out) if out else workdir
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        return _run(
            python, lengths, repeat, small, check, workdir, logdir, native_cpu_gb, timeout, json_out, hybrid
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _sizes(flag: str, text: str) -> list[int]:
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r} must be comma-separated token counts") from None
    if out and min(out) < 512:
        raise UsageError(f"{flag} needs prompt lengths of at least 512 tokens")
    return out


def build_models(
    workdir: Path, lengths: list[int], small: bool, check: bool, hybrid: list[int]
) -> list[dict[str, Any]]:
    """The spec's models: the token-check ones (real random weights), the Llama timing model and,
    with ``hybrid`` sizes, the Gemma-3-shaped one."""
    models: list[dict[str, Any]] = []
    # k whole chunks (256 tokens here) + 1: every hit kind computes exactly one token
    check_sizes = [513, 1025] if small else [1025, 2817]
    if check:
        cfg = build_check_model(workdir / "check", small)
        models.append(
            {
                "name": "check: Llama, real random weights",
                "path": str(workdir / "check"),
                "max_model_len": 4096,
                "max_num_batched_tokens": 4096,
                "sizes": check_sizes,
                "max_tokens": 8,
                "vocab": cfg["vocab_size"],
                "bytes_per_token": _kv_bytes_per_token(cfg),
                "gpu_memory_utilization": 0.1,
                "native_cpu_bytes": 1 << 30,
            }
        )
        if hybrid:
            cfg = build_gemma3_model(workdir / "check-gemma3", GEMMA3_SMALL, weights=True)
            models.append(
                {
                    "name": "check: Gemma-3-style, real random weights",
                    "path": str(workdir / "check-gemma3"),
                    "max_model_len": 4096,
                    "max_num_batched_tokens": 4096,
                    "sizes": check_sizes,
                    "max_tokens": 8,
                    "vocab": cfg["vocab_size"],
                    **_hybrid_bytes(cfg),
                    "gpu_memory_utilization": 0.1,
                    "native_cpu_bytes": 1 << 30,
                    "disk": False,
                }
            )
    cfg = build_timing_model(workdir / "timing", small)
    max_len = max(lengths)
    models.append(
        {
            "name": "Llama-3.1-8B shape, dummy weights" if not small else "small Llama, dummy weights",
            "path": str(workdir / "timing"),
            "load_format": "dummy",
            "max_model_len": max_len + 512,
            "max_num_batched_tokens": max(max_len, 2048),
            "sizes": lengths,
            "max_tokens": 1,
            "vocab": cfg["vocab_size"],
            "bytes_per_token": _kv_bytes_per_token(cfg),
            "gpu_memory_utilization": 0.3,
        }
    )
    if hybrid:
        dims = dict(GEMMA3_SMALL if small else GEMMA3_12B)
        dims["max_position_embeddings"] = max(dims["max_position_embeddings"], max(hybrid) + 512)
        cfg = build_gemma3_model(workdir / "timing-gemma3", dims)
        models.append(
            {
                "name": "Gemma-3-12B shape, dummy weights" if not small else "small Gemma-3, dummy weights",
                "path": str(workdir / "timing-gemma3"),
                "load_format": "dummy",
                "max_model_len": max(hybrid) + 512,
                "max_num_batched_tokens": max(max(hybrid), 2048),
                "sizes": hybrid,
                "max_tokens": 1,
                "vocab": cfg["vocab_size"],
                **_hybrid_bytes(cfg),
                # every engine of a process keeps its models alive: 0.1 + 0.1 + 0.3 + 0.35
                "gpu_memory_utilization": 0.35,
                # vLLM's CPU tier keeps the sliding groups' blocks too: room for two prompts
                "native_cpu_bytes": int(2.5 * max(hybrid) * _kv_bytes_per_token(cfg)),
                "disk": False,
            }
        )
    return models


def _run(
    python: str,
    lengths: list[int],
    repeat: int,
    small: bool,
    check: bool,
    workdir: Path,
    logdir: Path,
    native_cpu_gb: float,
    timeout: float,
    json_out: bool,
    hybrid: list[int],
) -> dict[str, Any]:
    ceiling = None
    try:
        import torch

        if torch.cuda.is_available():
            from infera.bench.transfer import pinned_ceiling

            ceiling = pinned_ceiling(torch.device("cuda"), size=1 << 30)[0]
    except ImportError:
        pass
    models = build_models(workdir, lengths, small, check, hybrid)

    # what the daemon keeps: every stored prompt (a hybrid model's chunks store each sliding
    # group's whole chunks when the window is longer than a chunk, so count full-length KV);
    # models without disk rows store in RAM only (retention short): no long-tier room for them
    def need(m: dict[str, Any], n: int) -> int:
        per = m["bytes_per_token"] + m.get("window_bytes_per_token", 0)
        return (repeat + 2 if m.get("disk", True) else 2) * n * per

    ram = sum(need(m, n) for m in models for n in m["sizes"])
    disk = sum(need(m, n) for m in models for n in m["sizes"] if m.get("disk", True))
    arena = int(ram * 1.3) + (1 << 30)
    long_path = workdir / "long"
    daemon = DaemonProcess(
        str(workdir / "kvd.sock"),
        [
            "--max-bytes",
            str(arena),
            "--long-path",
            str(long_path),
            "--long-bytes",
            str(int((disk * 1.3 + (1 << 30)) * 1.5)),
        ],
        workdir / "daemon.log",
        python=python,
        log_level="info",
        label="the benchmark daemon",
    )
    spec = {
        "models": models,
        "repeat": repeat,
        "native_cpu_bytes": int(native_cpu_gb * 1e9),
        "gpu_memory_utilization": None if small else 0.3,
        "kv_cache_bytes": (256 << 20) if small else None,
    }
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "INFERA_KVD_SOCKET": daemon.socket,
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"),
        "INFERA_KVD_REPORT_EVERY_S": "0",
        "VLLM_USE_FLASHINFER_SAMPLER": os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "0"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    records: list[dict[str, Any]] = []
    notes: dict[str, Any] = {}
    daemon.start(timeout=60)

    def restart() -> str:
        t = time.monotonic()
        daemon.stop(timeout=120)
        how = drop_page_cache(long_path)
        daemon.start(timeout=60)
        notes["restart"] = {"page_cache": how, "seconds": round(time.monotonic() - t, 1)}
        return how

    started = time.monotonic()
    try:
        for role in ("native", "kvd-a", "kvd-b"):
            records += run_engine(
                python, spec_path, role, env, logdir, timeout, restart if role == "kvd-b" else None
            )
    finally:
        daemon.stop(timeout=120)
        shutil.copy(daemon.log_path, logdir / "daemon.log") if logdir != workdir else None
    summary = summarize(records, models, ceiling)
    summary.update(
        date=time.strftime("%Y-%m-%d"),
        seconds=round(time.monotonic() - started),
        repeat=repeat,
        notes=notes,
        errors=[r for r in records if r["_kind"] in ("ERROR", "WARN")],
        info=[r for r in records if r["_kind"] == "INFO"],
    )
    (logdir / "results.json").write_text(json.dumps({"summary": summary, "records": records}, indent=1))
    if json_out:
        print(json.dumps(summary, indent=2))
    else:
        print(render(summary))
        for e in summary["errors"]:
            print(f"{e['_kind']}: {json.dumps(e)[:400]}")
    return summary
