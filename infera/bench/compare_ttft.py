"""The TTFT part of ``kvd bench compare``: real vLLM engines, one Python process each.

Every engine runs :mod:`infera.bench.compare_engine` in one Python with vLLM (by default the
benchmark venv, which also has LMCache) on the random-weight Llama of ``kvd bench ttft``. Each
request asks for one token with the engine's own prefix cache cleared first, so anything not
recomputed came through the connector. Rows:

* **recompute**: an engine with no connector; **vLLM prefix cache** (the limit): the same engine
  answering the prompt again with its own cache kept, the KV never having left the engine;
* **kvd**: InferaKvdConnector with a daemon (arena + disk tier): a RAM hit in the engine that
  stored the prompt, a RAM hit in a new engine process (the daemon outlives engines), and a disk
  hit from a new engine after the daemon was restarted (RAM empty, page cache of the chunk files
  dropped, each prompt's first read);
* **ExampleConnector** (vLLM's own, a safetensors file per request and layer): a hit in the engine
  that stored it, and from a new engine with the page cache of its files dropped;
* **LMCacheConnectorV1** with its CPU tier and local disk: a hit in the engine that stored it, and
  from a new engine (after a restart). A peer that cannot run is recorded with its error.

The first request for each prompt in a storing engine (computed, then saved) is kept as
``*_store`` rows: the cost of saving next to recompute.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from infera.bench.compare_runs import Tracker
from infera.kvd.process import kill_child

ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")
HARMLESS = ("Tokenizer not available",)


def kv_bytes_per_token(hidden: int, layers: int) -> int:
    return layers * max(1, hidden // 256) * 64 * 2 * 2


def engine_env(threads: int, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONHASHSEED": "0",
        "LMCACHE_TRACK_USAGE": "false",
        "DO_NOT_TRACK": "1",
        "LMCACHE_DISABLE_BANNER": "1",
    }
    env.update(extra)
    return env


def _log_errors(log: str) -> list[str]:
    """Exception lines in an engine's log (a peer may fail inside an engine that keeps running)."""
    seen: list[str] = []
    for line in log.splitlines():
        m = ERROR_LINE.search(line)
        if m and not any(h in line for h in HARMLESS):
            text = f"{m.group(1)}: {m.group(2).strip()}"[:300]
            if text not in seen:
                seen.append(text)
    return seen[:3]


def run_engine(
    python: str,
    spec: dict[str, Any],
    env: dict[str, str],
    work: Path,
    label: str,
    tracker: Tracker,
    timeout: float,
) -> dict[str, Any]:
    """One engine process; its per-request results, or ``error`` with the exact failure."""
    spec_path = work / f"{label}.json"
    spec_path.write_text(json.dumps(spec))
    log_path = work / f"{label}.log"
    tracker.note(f"TTFT: starting engine '{label}'")
    results: list[dict[str, Any]] = []
    final: dict[str, Any] | None = None
    engine_error: dict[str, Any] | None = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [python, "-m", "infera.bench.compare_engine", str(spec_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=str(work),
        )
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("STEP "):
                step = json.loads(line[5:])
                results.append(step)
                tracker.step(f"TTFT: {label} {step['name']} {step['seconds']:.2f}s")
            elif line.startswith("RESULT "):
                final = json.loads(line[7:])
            elif line.startswith("ENGINE-ERROR "):
                engine_error = json.loads(line[13:])
            if time.monotonic() > deadline:
                proc.kill()
                break
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_child(proc)
    log_text = log_path.read_text(errors="replace")
    out: dict[str, Any] = {"requests": results, "log_errors": _log_errors(log_text), "log": str(log_path)}
    if final is not None:
        out.update(model=final["model"], engine_start_s=final["engine_start_s"])
        return out
    if results:
        out["completed"] = [r["name"] for r in results]
    if engine_error is not None:
        out["error"] = f"{engine_error['type']}: {engine_error['message']} ({engine_error['where']})"
        out["failed_request"] = engine_error.get("request")
        out["log_errors"] = [e for e in out["log_errors"] if engine_error["message"][:80] not in e]
    elif proc.returncode in (-9, 137) or time.monotonic() > deadline:
        out["error"] = f"timed out after {timeout:.0f} s"
    else:
        errs = out["log_errors"]
        out["error"] = f"exit {proc.returncode}: " + (errs[-1] if errs else log_text.strip()[-300:])
    return out


def _requests(
    sizes: list[int], kinds: list[tuple[str, str | None, bool]], repeats: dict[str, int]
) -> list[Any]:
    reqs: list[dict[str, Any]] = []
    for n in sizes:
        for kind, retention, reset in kinds:
            for _ in range(repeats.get(kind, 1)):
                reqs.append(
                    {"name": f"{n}/{kind}", "tokens": n, "seed": 1, "retention": retention, "reset": reset}
                )
    return reqs


def plan_steps(sizes: list[int], repeats: int) -> int:
    """Requests the TTFT part sends (for the progress bar)."""
    per_size = 2 + (1 + 2 * repeats + 1) + (1 + repeats + 1) + (1 + repeats + 1)
    return per_size * len(sizes)


def _drop_page_cache(path: Path) -> None:
    from infera.bench.disk import _drop_cache

    if path.exists():
        _drop_cache(str(path))


def _wait_written(sock: str) -> None:
    from infera.kvd.client import KvdClient

    with KvdClient(sock, namespace="bench-compare", name="bench-compare-wait") as c:
        deadline = time.monotonic() + 300
        quiet = 0
        while quiet < 3 and time.monotonic() < deadline:
            long = c.stats()["tiers"]["long"]
            quiet = quiet + 1 if long["queued_writes"] == 0 else 0
            time.sleep(0.05)


def run_ttft(
    python: str,
    work: Path,
    sizes: list[int],
    repeats: int,
    hidden: int,
    layers: int,
    vocab: int,
    threads: int,
    tracker: Tracker,
    timeout: float = 3600,
) -> dict[str, Any]:
    from infera.bench.common import temp_daemon
    from infera.bench.ttft import _default_model_dir

    model_dir = _default_model_dir(hidden, layers, vocab)
    per_token = kv_bytes_per_token(hidden, layers)
    base_spec: dict[str, Any] = {
        "model": str(model_dir),
        "hidden": hidden,
        "layers": layers,
        "vocab": vocab,
        "kv_cache_bytes": max(256 << 20, 2 * per_token * (max(sizes) + 1024)),
        "max_model_len": max(sizes) + 64,
        # one prefill step per prompt: vLLM's ExampleConnector keeps one file per request and
        # layer, rewritten at each step, so with chunked prefill (4,096-token steps here) it keeps
        # the last step's KV only and its load of a longer prompt fails
        "max_num_batched_tokens": max(sizes) + 64,
    }
    env = engine_env(threads)
    engines: dict[str, dict[str, Any]] = {}
    hit_reps = {"hit": repeats, "hit-new-engine": repeats}

    def engine(label: str, kv: dict[str, Any] | None, reqs: list[Any], **extra_env: str) -> dict[str, Any]:
        spec = {**base_spec, "kv_transfer_config": kv, "requests": reqs}
        res = run_engine(python, spec, {**env, **extra_env}, work, label, tracker, timeout)
        engines[label] = res
        return res

    engine(
        "recompute", None, _requests(sizes, [("recompute", None, True), ("prefix-cache", None, False)], {})
    )

    # kvd: RAM hit in the storing engine, then in a new engine, then from disk after a restart
    kvd_conn = {
        "kv_connector": "InferaKvdConnector",
        "kv_role": "kv_both",
        "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
        "kv_load_failure_policy": "recompute",
    }
    tier = work / "kvd-tier"
    arena = max(512 << 20, 2 * per_token * sum(sizes))
    daemon_args = ["--max-bytes", str(arena), "--long-path", str(tier), "--long-bytes", str(4 * arena)]
    with temp_daemon(*daemon_args) as (sock, _proc):
        engine(
            "kvd",
            kvd_conn,
            _requests(sizes, [("store", "long", True), ("hit", None, True)], hit_reps),
            INFERA_KVD_SOCKET=sock,
        )
        engine(
            "kvd-new-engine",
            kvd_conn,
            _requests(sizes, [("hit-new-engine", None, True)], hit_reps),
            INFERA_KVD_SOCKET=sock,
        )
        _wait_written(sock)
    tracker.note("TTFT: kvd daemon restarted, page cache of its chunk files dropped")
    _drop_page_cache(tier)
    with temp_daemon(*daemon_args) as (sock, _proc):
        engine("kvd-disk", kvd_conn, _requests(sizes, [("disk-hit", None, True)], {}), INFERA_KVD_SOCKET=sock)

    # vLLM's ExampleConnector: files per request and layer
    ex_dir = work / "example-kv"
    ex_conn = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(ex_dir)},
    }
    engine("example", ex_conn, _requests(sizes, [("store", None, True), ("hit", None, True)], hit_reps))
    _drop_page_cache(ex_dir)
    engine("example-restart", ex_conn, _requests(sizes, [("disk-hit", None, True)], {}))

    # LMCacheConnectorV1: its CPU tier plus its local disk
    lmc_dir = work / "lmcache-disk"
    lmc_dir.mkdir(exist_ok=True)
    gib = max(1.0, 2 * per_token * sum(sizes) / 2**30)
    lmc_env = {
        "LMCACHE_CHUNK_SIZE": "256",
        "LMCACHE_LOCAL_CPU": "True",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{gib:.1f}",
        "LMCACHE_LOCAL_DISK": f"file://{lmc_dir}/",
        "LMCACHE_MAX_LOCAL_DISK_SIZE": f"{gib:.1f}",
    }
    lmc_conn = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    probe = subprocess.run([python, "-c", "import lmcache"], capture_output=True, text=True, env=env)
    if probe.returncode != 0:
        err = ERROR_LINE.search(probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "")
        missing = err.group(0) if err else "cannot import lmcache"
        engines["lmcache"] = engines["lmcache-restart"] = {
            "requests": [],
            "error": f"{missing} in {python} (scripts/setup.sh --bench creates .venv-bench with it)",
        }
    else:
        first = engine(
            "lmcache",
            lmc_conn,
            _requests(sizes, [("store", None, True), ("hit", None, True)], hit_reps),
            **lmc_env,
        )
        hits = sum(r["external_hits"] for r in first["requests"])
        if "error" in first or not hits:
            for _ in sizes:
                tracker.step("TTFT: lmcache-restart skipped")
            why = first.get("error") or "; ".join(first["log_errors"]) or "no external hits"
            engines["lmcache-restart"] = {
                "requests": [],
                "error": f"not measured: the first engine failed ({why})",
            }
        else:
            _drop_page_cache(lmc_dir)
            engine("lmcache-restart", lmc_conn, _requests(sizes, [("disk-hit", None, True)], {}), **lmc_env)
    model = next((e["model"] for e in engines.values() if "model" in e), None)
    return {
        "python": python,
        "model_dir": str(model_dir),
        "model": model,
        "sizes": sizes,
        "repeats": repeats,
        "threads": threads,
        "kv_bytes_per_token": per_token,
        "engines": engines,
        "rows": summarize(engines, sizes),
    }


# (row id, engine, request kind, label)
ROWS: list[tuple[str, str, str, str]] = [
    ("recompute", "recompute", "recompute", "recompute (no connector)"),
    ("prefix_cache", "recompute", "prefix-cache", "vLLM's own prefix cache (limit)"),
    ("kvd_ram", "kvd", "hit", "kvd, RAM hit"),
    ("kvd_new_engine", "kvd-new-engine", "hit-new-engine", "kvd, RAM hit, new engine"),
    ("kvd_disk", "kvd-disk", "disk-hit", "kvd, disk hit after daemon restart"),
    ("example", "example", "hit", "ExampleConnector"),
    ("example_restart", "example-restart", "disk-hit", "ExampleConnector, new engine"),
    ("lmcache_cpu", "lmcache", "hit", "LMCache, CPU tier"),
    ("lmcache_disk", "lmcache-restart", "disk-hit", "LMCache, local disk after restart"),
    ("kvd_store", "kvd", "store", "kvd, first request (compute + save)"),
    ("example_store", "example", "store", "ExampleConnector, first request (compute + save)"),
    ("lmcache_store", "lmcache", "store", "LMCache, first request (compute + save)"),
]
PEER_ROWS = ("example", "example_restart", "lmcache_cpu", "lmcache_disk")


def summarize(engines: dict[str, dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Best (least disturbed) time per row and prompt length, hit tokens and whether the first
    token matches recompute's."""
    ref_tokens = {}
    for r in engines.get("recompute", {}).get("requests", []):
        if r["name"].endswith("/recompute"):
            ref_tokens[r["tokens"]] = r["token"]
    rows: dict[str, Any] = {}
    for row_id, eng, kind, label in ROWS:
        e = engines.get(eng, {})
        row: dict[str, Any] = {"label": label, "by_size": {}}
        if e.get("error"):
            row["error"] = e["error"]
            if e.get("failed_request"):
                row["failed_request"] = e["failed_request"]
        if e.get("log_errors"):
            row["log_errors"] = e["log_errors"]
        for n in sizes:
            got = [r for r in e.get("requests", []) if r["name"] == f"{n}/{kind}"]
            if not got:
                continue
            best = min(got, key=lambda r: r["seconds"])
            row["by_size"][str(n)] = {
                "seconds": best["seconds"],
                "load_s": best.get("load_s", 0.0),
                "load_bytes": best.get("load_bytes", 0),
                "samples": [round(r["seconds"], 4) for r in got],
                "hit_tokens": int(max(r["external_hits"] for r in got)),
                "cached_tokens": int(max(r["cached_tokens"] for r in got)),
                "same_token": all(r["token"] == ref_tokens.get(n) for r in got) if n in ref_tokens else None,
            }
        rows[row_id] = row
    return rows


__all__ = ["PEER_ROWS", "ROWS", "plan_steps", "run_ttft", "summarize"]
