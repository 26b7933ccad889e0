"""The pieces of ``benchmarks/pd.py`` (the P/D story on one host) that hold no phase logic: the
deployment ``kvd launch pd`` writes and the changed kv-transfer-configs of the phases, the
processes it starts (engines, router, etcd), one streamed request, the models, the metrics and
log lines it keeps. ``tests/launch/test_pd_bench.py`` tests them without an engine."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from infera.bench.services import Etcd
from infera.kvd.process import stop_group

# engine metrics worth a snapshot after each phase (summed over their labels)
METRICS = (
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_by_source_total",
)
# log lines that show the KV moving: Mooncake's own (the decode leg at DEBUG logs each pull),
# the engines' periodic stats, our connector's
EVIDENCE = re.compile(
    r"pulling kv_caches|Mooncake|KV Transfer metrics|External prefix cache hit rate: (?!0\.0%)"
    r"|infera-kvd|Querying Mooncake|Queried Mooncake|Got Mooncake|bootstrap| ERROR |Traceback"
)
QUIET = re.compile(r"Avg prompt throughput: 0\.0 tokens/s")  # idle stats lines repeat the last rate


class PdError(RuntimeError):
    """A step of the run failed; the message says which and ends with the log's tail."""


def interface_ips() -> list[str]:
    """IPv4 addresses of this host's interfaces, loopback last (Linux ioctl SIOCGIFADDR)."""
    out: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                out.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]))
            except OSError:
                continue
    return sorted(out, key=lambda ip: ipaddress.ip_address(ip).is_loopback)


def routable_ip() -> str:
    """This host's address as other hosts see it (``kvd launch pd`` refuses loopback): the
    source address of the default route, else the first non-loopback interface address (a host
    with no default route, such as an isolated GPU machine)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return str(s.getsockname()[0])
    for ip in interface_ips():
        if not ipaddress.ip_address(ip).is_loopback:
            return ip
    raise PdError("pd bench: no non-loopback IPv4 address on this host; pass --advertise-host")


def launch_spec(a: argparse.Namespace, host: str, sock: str) -> dict[str, Any]:
    """The deployment `kvd launch pd` writes for these options (its JSON spec)."""
    argv = [sys.executable, "-m", "infera.cli", "launch", "pd", "--model", a.model, "--etcd", a.etcd]
    argv += ["--advertise-host", host, "--socket", sock, "--max-bytes", a.max_bytes, "--format", "json"]
    argv += ["--router-port", str(a.router_port), "--python", a.python]
    if a.transfer_protocol:
        argv += ["--transfer-protocol", a.transfer_protocol]
    for extra in engine_args(a):
        argv.append(f"--engine-arg={extra}")
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise PdError(f"pd bench: kvd launch pd failed: {res.stderr.strip()[-2000:]}")
    return dict(json.loads(res.stdout))


def engine_args(a: argparse.Namespace) -> list[str]:
    out = ["--served-model-name=bench", f"--max-model-len={a.max_model_len}", "--max-num-seqs=4"]
    if a.gpu_memory_utilization:
        out.append(f"--gpu-memory-utilization={a.gpu_memory_utilization}")
    if a.kv_cache_memory_bytes:
        out.append(f"--kv-cache-memory-bytes={a.kv_cache_memory_bytes}")
    if a.load_format:
        out.append(f"--load-format={a.load_format}")
    if a.enforce_eager:
        out.append("--enforce-eager")
    if a.skip_tokenizer_init:
        out.append("--skip-tokenizer-init")
    return out


def ktc_index(argv: list[str]) -> int:
    return argv.index("--kv-transfer-config") + 1


def with_ktc(argv: list[str], cfg: dict[str, Any]) -> list[str]:
    i = ktc_index(argv)
    return [*argv[:i], json.dumps(cfg), *argv[i + 1 :]]


def to_example(argv: list[str], role: str, store: str) -> list[str]:
    """Swap the legs' MooncakeConnector for ExampleConnector on ``store`` (CPU hosts)."""
    cfg = json.loads(argv[ktc_index(argv)])
    example: dict[str, Any] = {"kv_connector": "ExampleConnector", "kv_role": role}
    example["kv_connector_extra_config"] = {"shared_storage_path": store}
    if cfg["kv_connector"] == "MultiConnector":
        cfg["kv_connector_extra_config"]["connectors"][1] = example
    else:
        cfg = example
    return with_ktc(argv, cfg)


def without_kvd(argv: list[str]) -> list[str]:
    """The prefill leg's command with the transport child alone (no InferaKvdConnector): P/D
    as it runs without kvd, the baseline of the kvd rows."""
    cfg = json.loads(argv[ktc_index(argv)])
    if cfg["kv_connector"] == "MultiConnector":
        cfg = {**cfg["kv_connector_extra_config"]["connectors"][1], "kv_role": "kv_producer"}
    return with_ktc(argv, cfg)


def top_level_both(argv: list[str]) -> list[str]:
    """The prefill leg's command with its top-level ``kv_role`` set to ``kv_both`` and the
    children untouched: the mistake ``kvd doctor --etcd`` reports as MIXED."""
    cfg = json.loads(argv[ktc_index(argv)])
    return with_ktc(argv, {**cfg, "kv_role": "kv_both"})


def router_argv(argv: list[str], transport: str) -> list[str]:
    """The router's command of the spec; with ``example`` there is no Mooncake bootstrap server
    to ask, so the router runs with its default hand-off."""
    out = list(argv)
    if transport == "example":
        i = out.index("--kv-connector")
        del out[i : i + 2]
        j = out.index("--prefill")
        if j + 2 < len(out) and out[j + 2].isdigit():
            del out[j + 2]
    return out


def parse_metrics(text: str, names: tuple[str, ...] = METRICS) -> dict[str, float]:
    """Prometheus text -> {name: value summed over every label set} for ``names``; a name with
    a ``source`` label also gets one entry per source (``name{source=...}``)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[-+]Inf)", line)
        if not m or m.group(1) not in names:
            continue
        name, value = m.group(1), float(m.group(3))
        out[name] = out.get(name, 0.0) + value
        src = re.search(r'source="([^"]*)"', m.group(2) or "")
        if src:
            key = f'{name}{{source="{src.group(1)}"}}'
            out[key] = out.get(key, 0.0) + value
    return out


def evidence(path: Path, limit: int = 12) -> list[str]:
    """The first and last lines of a log that show KV moving or failing (at most ``limit``)."""
    try:
        text = path.read_text(errors="replace")
        lines = [ln.rstrip() for ln in text.splitlines() if EVIDENCE.search(ln) and not QUIET.search(ln)]
    except OSError:
        return []
    if len(lines) <= limit:
        return lines
    half = limit // 2
    return [*lines[:half], f"... ({len(lines) - limit} more)", *lines[-half:]]


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], work: Path, port: int) -> None:
        self.name, self.port, self.log_path = name, port, work / f"{name}.log"
        self.argv = argv
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{port}"
        self.started = time.monotonic()
        self.ready_s = float("nan")

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PdError(
                    f"pd bench: {self.name} exited with {self.proc.returncode}; its log ends:\n{self.tail()}"
                )
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - self.started
                    print(f"pd bench: {self.name} ready after {self.ready_s:.0f} s", flush=True)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise PdError(f"pd bench: {self.name} not up after {timeout:g} s; its log ends:\n{self.tail()}")

    def stop(self) -> None:
        stop_group(self.proc)

    def metrics(self) -> dict[str, float]:
        try:
            return parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text)
        except httpx.HTTPError as exc:
            return {"error": 1.0, "detail_" + type(exc).__name__: 1.0}

    def reset_prefix_cache(self) -> bool:
        """``POST /reset_prefix_cache`` (vLLM dev mode) until it succeeds: it fails while blocks
        are held, e.g. by a transfer still under way."""
        for _ in range(40):
            try:
                r = httpx.post(self.url + "/reset_prefix_cache", timeout=30)
                if r.status_code == 200 and r.json().get("success", True):
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        return False


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return [(i * (7 + 2 * seed) + 3 * seed + 3) % (vocab - 3) + 3 for i in range(n)]


def request(url: str, ids: list[int], tokens: int, timeout: float = 1800) -> dict[str, Any]:
    """One streamed greedy request: TTFT (seconds to the first data chunk) and the generated
    token ids (from the chunks' ``token_ids``, else from a second, plain request)."""
    body: dict[str, Any] = {"model": "bench", "prompt": ids, "max_tokens": tokens, "temperature": 0}
    body.update(ignore_eos=True, return_token_ids=True)
    t0 = time.perf_counter()
    ttft = float("nan")
    out: list[int] = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=timeout) as r:
        if r.status_code != 200:
            raise PdError(f"pd bench: {url} answered {r.status_code}: {r.read().decode()[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft != ttft:
                ttft = time.perf_counter() - t0
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise PdError(f"pd bench: {url} streamed an error: {line[:500]}")
            for c in chunk.get("choices", []):
                out += c.get("token_ids") or []
    total = time.perf_counter() - t0
    if not out:
        r2 = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
        out = list(r2.json()["choices"][0]["token_ids"])
    return {"ttft": ttft, "total": total, "out": out}


def tiny_model(work: Path, max_len: int) -> str:
    """A 2-layer Llama with random but saved (real) weights; head size 64, which every
    attention backend takes (the GPU's FlashAttention 3 among them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      vocab_size=1000, max_position_embeddings=max(4096, max_len), intermediate_size=512,
                      num_hidden_layers=2, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False, torch_dtype="bfloat16")  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(work / "tiny")
    return str(work / "tiny")


def llama8b_model(work: Path) -> str:
    """Llama-3.1-8B's config alone (no weights, no tokenizer): run with ``--load-format dummy``."""
    from infera.bench.gpu_e2e_models import build_timing_model

    build_timing_model(work / "llama8b", small=False)
    return str(work / "llama8b")


def start_etcd(binary: str, endpoint: str, work: Path) -> Etcd:
    """``binary`` serving the loopback ``endpoint`` (``127.0.0.1:PORT``) for the run."""
    host, port = endpoint.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        raise PdError(f"pd bench: --etcd-binary starts etcd on loopback; --etcd {endpoint} is not")
    etcd = Etcd(work, exe=binary, port=int(port))
    try:
        etcd.start()
    except RuntimeError as exc:
        raise PdError(f"pd bench: {exc}") from None
    return etcd


def doctor(a: argparse.Namespace, want: str, timeout: float = 20) -> dict[str, Any]:
    """``kvd doctor --etcd`` (the pd-workers check), again until its output mentions ``want``
    (a worker registers once it serves, a moment after /health answers)."""
    argv = [sys.executable, "-m", "infera.cli", "doctor", "--etcd", a.etcd, "--check", "pd-workers"]
    deadline = time.monotonic() + timeout
    while True:
        res = subprocess.run(argv, capture_output=True, text=True)
        if want in res.stdout or time.monotonic() > deadline:
            return {
                "argv": argv[1:],
                "rc": res.returncode,
                "stdout": res.stdout,
                "stderr": res.stderr[-2000:],
            }
        time.sleep(1)
