"""The whole P/D story in one run: kvd daemon, prefill and decode legs and vllm-router, as
``kvd launch pd`` writes them, then TTFT through the router and greedy output, and a table.

    python benchmarks/pd.py --model /path/or/hf-id --lengths 8192,16384 --gpu-memory-utilization 0.4
    python benchmarks/pd.py --tiny --lengths 512,1000 --transport example   # this CPU machine

Steps: start the daemon and both legs (the commands of ``kvd launch pd --format json``, with the
extra engine flags given here), then the router; send one fresh prompt per length through the
router (a kvd miss: the prefill leg computes and stores it); restart the prefill engine (its own
prefix cache is gone, kvd is not) and send the same prompts again (a kvd hit on the prefill leg);
restart it once more with the transport connector alone (P/D without kvd, the baseline); stop the
legs and send the prompts to one plain vLLM engine without kvd or P/D. It prints TTFT per
length and path, whether the greedy tokens agree, and the daemon's counters.

``--transport mooncake`` (the product: MooncakeConnector, the router's ``--kv-connector mooncake``)
needs a CUDA host. ``--transport example`` puts vLLM's ExampleConnector (a file hand-off) in the
Mooncake child's place and runs the router without ``--kv-connector mooncake``: vLLM's
MooncakeConnector cannot start without an accelerator (docs/pd.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from infera.kvd.process import DaemonProcess, stop_group


def routable_ip() -> str:
    """This host's address as other hosts see it (``kvd launch pd`` refuses loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return str(s.getsockname()[0])


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
        sys.exit(f"pd bench: kvd launch pd failed: {res.stderr.strip().splitlines()[-1]}")
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


def to_example(argv: list[str], role: str, store: str) -> list[str]:
    """Swap the legs' MooncakeConnector for ExampleConnector on ``store`` (CPU hosts)."""
    i = argv.index("--kv-transfer-config") + 1
    cfg = json.loads(argv[i])
    example = {"kv_connector": "ExampleConnector", "kv_role": role}
    example["kv_connector_extra_config"] = {"shared_storage_path": store}
    if cfg["kv_connector"] == "MultiConnector":
        cfg["kv_connector_extra_config"]["connectors"][1] = example
    else:
        cfg = example
    return [*argv[:i], json.dumps(cfg), *argv[i + 1 :]]


def without_kvd(argv: list[str]) -> list[str]:
    """The prefill leg's command with the transport child alone (no InferaKvdConnector): P/D
    as it runs without kvd, the baseline of the kvd rows."""
    i = argv.index("--kv-transfer-config") + 1
    cfg = json.loads(argv[i])
    if cfg["kv_connector"] == "MultiConnector":
        cfg = {**cfg["kv_connector_extra_config"]["connectors"][1], "kv_role": "kv_producer"}
    return [*argv[:i], json.dumps(cfg), *argv[i + 1 :]]


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], work: Path, port: int) -> None:
        self.name, self.port, self.log_path = name, port, work / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{port}"

    def wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                sys.exit(f"pd bench: {self.name} exited with {self.proc.returncode}; its log ends:\n{tail}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        sys.exit(f"pd bench: {self.name} not up after {timeout:g} s (log: {self.log_path})")

    def stop(self) -> None:
        stop_group(self.proc)


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return [(i * (7 + 2 * seed) + 3 * seed + 3) % (vocab - 3) + 3 for i in range(n)]


def request(url: str, ids: list[int], tokens: int) -> tuple[float, list[int]]:
    """(TTFT in seconds from a streamed request, greedy token ids from a second, plain one)."""
    body: dict[str, Any] = {"model": "bench", "prompt": ids, "max_tokens": tokens, "temperature": 0}
    t0 = time.perf_counter()
    ttft = float("nan")
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=1800) as r:
        if r.status_code != 200:
            sys.exit(f"pd bench: {url} answered {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and ttft != ttft:
                ttft = time.perf_counter() - t0
    r2 = httpx.post(url + "/v1/completions", json={**body, "return_token_ids": True}, timeout=1800)
    return ttft, list(r2.json()["choices"][0]["token_ids"])


def tiny_model(work: Path) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      vocab_size=1000, max_position_embeddings=4096, intermediate_size=256,
                      num_hidden_layers=2, initializer_range=0.2, torch_dtype="bfloat16")  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(work / "tiny")
    return str(work / "tiny")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model path or Hugging Face id")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer random Llama made here (CPU runs)")
    ap.add_argument("--lengths", default="8192,16384", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--transport", choices=("mooncake", "example"), default="mooncake")
    ap.add_argument("--transfer-protocol", choices=("tcp", "rdma"), help="Mooncake protocol (kvd launch's)")
    ap.add_argument("--gpu-memory-utilization", type=float, help="per engine (two share a GPU unless split)")
    ap.add_argument("--kv-cache-memory-bytes", type=int, help="engine KV cache size (CPU hosts)")
    ap.add_argument("--load-format", help="e.g. dummy: random weights, no download")
    ap.add_argument("--max-model-len", type=int, default=0, help="default: the longest length + 64")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--skip-tokenizer-init", action="store_true")
    ap.add_argument(
        "--prefill-devices", help="CUDA_VISIBLE_DEVICES of the prefill leg (and the single engine)"
    )
    ap.add_argument("--decode-devices", help="CUDA_VISIBLE_DEVICES of the decode leg")
    ap.add_argument("--max-bytes", default="16G", help="the daemon's RAM tier")
    ap.add_argument("--etcd", default="127.0.0.1:2379", help="where the legs register (no etcd is fine)")
    ap.add_argument("--router-port", type=int, default=8000)
    ap.add_argument("--python", default=sys.executable, help="the engines' and router's Python")
    ap.add_argument("--vocab", type=int, default=1000, help="token ids of the prompts stay below this")
    ap.add_argument("--workdir", help="logs and the daemon socket (default: a new temporary directory)")
    ap.add_argument("--startup-timeout", type=float, default=900)
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    a.max_model_len = a.max_model_len or max(lengths) + a.max_tokens + 64
    work = Path(a.workdir or tempfile.mkdtemp(prefix="pd-bench-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        a.model, a.skip_tokenizer_init, a.enforce_eager = tiny_model(work), True, True
    if not a.model:
        sys.exit("pd bench: --model is required (or --tiny)")
    host, sock = routable_ip(), str(work / "kvd.sock")
    spec = launch_spec(a, host, sock)
    base = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    legs = {leg["name"]: leg for leg in spec["legs"]}
    d_argv = spec["daemon"]["argv"]
    at = d_argv.index("--socket")  # DaemonProcess adds --socket itself
    daemon = DaemonProcess(sock, d_argv[at + 2 :], work / "kvd.log", command=d_argv[:at]).start()
    procs: list[Proc] = []

    def leg(name: str, tag: str = "", kvd: bool = True) -> Proc:
        spec_leg = legs[name]
        argv = spec_leg["argv"]
        if a.transport == "example":
            argv = to_example(
                argv, "kv_producer" if name == "prefill" else "kv_consumer", str(work / "handoff")
            )
        if not kvd:
            argv = without_kvd(argv)
        env = {
            **base,
            **spec_leg["env"],
            "VLLM_MOONCAKE_BOOTSTRAP_PORT": "8998" if name == "prefill" else "8999",
        }
        devices = a.prefill_devices if name == "prefill" else a.decode_devices
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices
        port = int(argv[argv.index("--port") + 1])
        p = Proc(name + tag, argv, env, work, port)
        procs.append(p)
        return p

    rows: list[dict[str, Any]] = []
    try:
        prefill, decode = leg("prefill"), leg("decode")
        prefill.wait("/health", a.startup_timeout)
        decode.wait("/health", a.startup_timeout)
        r_argv = list(spec["routers"][0]["argv"])
        if a.transport == "example":  # no Mooncake bootstrap server to ask: the router's default hand-off
            i = r_argv.index("--kv-connector")
            del r_argv[i : i + 2]
            r_argv.remove("8998")
        router = Proc("router", r_argv, base, work, a.router_port)
        procs.append(router)
        router.wait("/health", 120)
        prompts = {n: prompt(n, seed, a.vocab) for seed, n in enumerate(lengths, 1)}
        for n, ids in prompts.items():
            rows.append(
                {
                    "path": "P/D, kvd miss (cold)",
                    "tokens": n,
                    **dict(zip(("ttft", "out"), request(router.url, ids, a.max_tokens), strict=True)),
                }
            )
        stored = daemon.stats()
        prefill.stop()
        prefill = leg("prefill", "-restarted")
        prefill.wait("/health", a.startup_timeout)
        for n, ids in prompts.items():
            rows.append(
                {
                    "path": "P/D, kvd hit (prefill restarted)",
                    "tokens": n,
                    **dict(zip(("ttft", "out"), request(router.url, ids, a.max_tokens), strict=True)),
                }
            )
        counters = daemon.stats()
        prefill.stop()  # the same prompts once more, through a prefill leg without kvd
        prefill = leg("prefill", "-without-kvd", kvd=False)
        prefill.wait("/health", a.startup_timeout)
        for n, ids in prompts.items():
            rows.append(
                {
                    "path": "P/D without kvd",
                    "tokens": n,
                    **dict(zip(("ttft", "out"), request(router.url, ids, a.max_tokens), strict=True)),
                }
            )
        for p in (router, prefill, decode):
            p.stop()
        single_argv = [
            a.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            a.model,
            "--port",
            str(a.router_port + 10),
        ]
        single_env = {**base, **({"CUDA_VISIBLE_DEVICES": a.prefill_devices} if a.prefill_devices else {})}
        single = Proc("single", [*single_argv, *engine_args(a)], single_env, work, a.router_port + 10)
        procs.append(single)
        single.wait("/health", a.startup_timeout)
        for n, ids in prompts.items():
            rows.append(
                {
                    "path": "single engine, no kvd",
                    "tokens": n,
                    **dict(zip(("ttft", "out"), request(single.url, ids, a.max_tokens), strict=True)),
                }
            )
    finally:
        for p in reversed(procs):
            p.stop()
        daemon.stop()
    report(rows, stored, counters, a, work)


def report(
    rows: list[dict[str, Any]],
    stored: dict[str, Any],
    counters: dict[str, Any],
    a: argparse.Namespace,
    work: Path,
) -> None:
    print(f"P/D through vllm-router: model {a.model}, transport {a.transport}, logs in {work}")
    print(f"{'path':34} {'tokens':>7} {'TTFT ms':>9} {'x single':>9}  greedy = single")
    single = {r["tokens"]: r for r in rows if r["path"].startswith("single")}
    for r in rows:
        ref = single.get(r["tokens"])
        ratio = f"{r['ttft'] / ref['ttft']:.2f}" if ref else "-"
        same = "-" if ref is None else ("yes" if r["out"] == ref["out"] else "NO")
        print(f"{r['path']:34} {r['tokens']:>7} {r['ttft'] * 1000:>9.1f} {ratio:>9}  {same}")
    keys = ("sets_total", "gets_total", "hits_total", "misses_total")
    print("daemon after the cold requests: " + ", ".join(f"{k} {stored.get(k)}" for k in keys))
    print("daemon after the restarted leg: " + ", ".join(f"{k} {counters.get(k)}" for k in keys))


if __name__ == "__main__":
    main()
