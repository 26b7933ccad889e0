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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from infera import loadreport
from infera.bench import gpu_e2e_report as report
from infera.bench.args import above_zero, at_least, vllm_python
from infera.bench.gpu_e2e_models import build_models
from infera.bench.gpu_e2e_summary import summarize
from infera.bench.ttft import prompt_lengths
from infera.errors import KvdError, UsageError
from infera.kvd.process import DaemonProcess, kill_group


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
        start_new_session=True,  # its helpers (vLLM's resource tracker) go with it
    )
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None and proc.stdin is not None
    # an engine that prints nothing more is not waited for past its time either
    watchdog = threading.Timer(timeout + 60, kill_group, (proc,))
    watchdog.daemon = True
    watchdog.start()
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
            if kind == "DONE":  # a helper it left behind may hold stdout open: stop reading
                break
            if time.monotonic() > deadline:
                raise KvdError(f"engine {role} ran past {timeout:.0f} s")
        proc.wait(30)
    finally:
        watchdog.cancel()
        kill_group(proc)
        log.close()
    if not any(r["_kind"] == "DONE" for r in records):
        tail = (logdir / f"engine-{role}.log").read_text(errors="replace")[-1500:]
        records.append({"_kind": "ERROR", "role": role, "error": f"exit {proc.returncode}: {tail}"})
    return records


def _every_engine_failed(records: list[dict[str, Any]], logdir: Path | None) -> KvdError:
    """The one-line error of a run in which no engine measured anything: the first engine's
    error, cut to its last line (the exception of a traceback)."""
    errors = [r for r in records if r["_kind"] == "ERROR"]
    first = errors[0] if errors else {"role": "?", "error": "no results and no error"}
    lines = [ln.strip() for ln in str(first.get("error", "")).splitlines() if ln.strip()]
    why = (lines[-1] if lines else "no error message")[:300]
    return KvdError(
        f"every engine failed ({len(errors)} errors); the first, engine {first.get('role', '?')}: {why}",
        hint=f"the engine logs are in {logdir}" if logdir else "pass --out DIR to keep the engine logs",
    )


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
    sweep: str = "",
    partial: str = "1024,4096",
    load_policy: str = loadreport.DEFAULT_POLICY,
    layerwise: bool = False,
    cuda_graphs: bool = False,
) -> dict[str, Any]:
    if load_policy not in loadreport.POLICIES:
        raise UsageError(f"--load-policy {load_policy!r} must be one of {', '.join(loadreport.POLICIES)}")
    at_least(repeat, "--repeat")
    at_least(timeout, "--timeout", 1.0)
    above_zero(native_cpu_gb, "--native-cpu-gb")
    lengths = prompt_lengths(sizes, 512)
    if sweep.strip():
        lengths += prompt_lengths(
            report.SWEEP_DEFAULT if sweep.strip() == "default" else sweep, 512, "--sweep"
        )
    lengths = sorted(set(lengths))
    extras = prompt_lengths(partial, 1, "--partial") if partial.strip() else []
    hybrid = prompt_lengths(gemma3_sizes, 512, flag="--gemma3-sizes") if gemma3_sizes.strip() else []
    python = vllm_python(python, "--python")  # as bench ttft: before any daemon or engine starts
    workdir = Path(tempfile.mkdtemp(prefix="kvd-e2e-", dir="/tmp"))
    logdir = Path(out) if out else workdir
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        opts = {
            "sweep": bool(sweep.strip()),
            "partial": extras,
            "load_policy": load_policy,
            "layerwise": layerwise,
            "cuda_graphs": cuda_graphs,
        }
        return _run(
            python,
            lengths,
            repeat,
            small,
            check,
            workdir,
            logdir,
            native_cpu_gb,
            timeout,
            json_out,
            hybrid,
            opts,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
    opts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    opts = opts or {}
    policy = str(opts.get("load_policy", loadreport.DEFAULT_POLICY))
    ceiling = None
    try:
        import torch

        if torch.cuda.is_available():
            from infera.bench.transfer import pinned_ceiling

            ceiling = pinned_ceiling(torch.device("cuda"), size=1 << 30)[0]
    except ImportError:
        pass
    models = build_models(workdir, lengths, small, check, hybrid, opts.get("partial"))

    # what the daemon keeps: every stored prompt (a hybrid model's chunks store each sliding
    # group's whole chunks when the window is longer than a chunk, so count full-length KV);
    # models without disk rows store in RAM only (retention short): no long-tier room for them
    def need(m: dict[str, Any], n: int) -> int:
        per = m["bytes_per_token"] + m.get("window_bytes_per_token", 0)
        return (repeat + 2 if m.get("disk", True) else 2) * n * per

    # partial hits store each request's new tokens too (a new suffix per request)
    turns = sum(repeat * x * m["bytes_per_token"] for m in models for x in m.get("partial") or [])
    ram = sum(need(m, n) for m in models for n in m["sizes"]) + turns
    disk = sum(need(m, n) for m in models for n in m["sizes"] if m.get("disk", True)) + turns
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
        "cuda_graphs": bool(opts.get("cuda_graphs")),
    }
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "INFERA_KVD_SOCKET": daemon.socket,
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"),
        "INFERA_KVD_REPORT_EVERY_S": "0",
        "INFERA_KVD_LOAD_POLICY": policy,
        "INFERA_KVD_LOAD_LAYERWISE": "1" if opts.get("layerwise") else "0",
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
    if not any(r["_kind"] == "RESULT" for r in records):
        raise _every_engine_failed(records, logdir if logdir != workdir else None)
    summary = summarize(records, models, ceiling, policy)
    timing = next(m["name"] for m in models if m["name"].startswith(("Llama", "small Llama")))
    summary["load_policy"] = policy
    summary["layerwise"] = bool(opts.get("layerwise"))
    summary["cuda_graphs"] = spec["cuda_graphs"]
    summary["partial"] = report.partial_rows(records, policy)
    summary["sweep"] = report.sweep_table(summary, timing) if opts.get("sweep") else []
    summary["plot"] = (
        report.plot(summary["sweep"], logdir / "ttft_vs_length.png", f"{timing}, policy {policy}")
        if opts.get("sweep")
        else None
    )
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
        print(
            f"kvd engines: load policy {policy}, layer-wise loads {'on' if summary['layerwise'] else 'off'}; "
            f"{'CUDA graphs' if spec['cuda_graphs'] else 'enforce_eager'}"
        )
        print(report.render_rows(summary))
        print(report.render(summary["partial"], summary["sweep"], summary["plot"]))
        for e in summary["errors"]:
            print(f"{e['_kind']}: {json.dumps(e)[:400]}")
    return summary
