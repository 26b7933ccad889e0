"""The key rules are written once (infera.keyrules), so the connector, kvd doctor and kvd lint agree.

* whatever ``auto`` picks, for every model shape the tests and benchmarks use and on both paths,
  neither doctor (check ``chunk-tokens``) nor lint (KVD303) calls it small;
* on the same settings, doctor and lint give the same verdict (small, invalid or fine), and the
  same hash-seed verdict (random per process, unknown, or stable);
* the one rule the connector keeps a copy of (``ConnectorEnv.gpu_direct_requested``) agrees.

Doctor runs for real over fake processes (the psutil seam it reads engines through); lint runs for
real over an env file or a script. No vLLM, no daemon.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infera import keyrules as KR
from infera.bench.transfer import DTYPES, SHAPES
from infera.doctor.checks.chunk_tokens import chunk_tokens
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.facts.engines import EngineProcess, effective_seed
from infera.doctor.model import Status
from infera.engine.vllm.config import read_env
from infera.launch.lint import Source, lint_sources
from infera.launch.rules import Context as LintContext

GPU_DIRECT = {"INFERA_KVD_AIS": "1", "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/kvd-long"}
GPU_DIRECT_AUTO = {"INFERA_KVD_AIS": "auto", "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/kvd-long"}
RAM = {"INFERA_KVD_AIS": "0"}
PATHS = {"ram": RAM, "ram-unset": {}, "gpu-direct": GPU_DIRECT, "gpu-direct-auto": GPU_DIRECT_AUTO}

# (bytes of KV per token on one rank, block size) of every model shape the tests and benchmarks use.
SHAPES_USED: dict[str, tuple[int, int]] = {
    "tiny test Llama (tests/vllm, e2e)": (512, 128),
    "bench Llama 156M": (8192, 128),
    "Llama-3.1-8B TP1 (test_keys)": (128 * 1024, 16),
    "70B-class TP1 (test_keys)": (320 * 1024, 16),
    "block above the 256-token cap (test_keys)": (64, 256),
    "gpu path, 4-token blocks (test_gpu_path)": (192, 4),
    "layout test (test_layout)": (1024, 16),
    "cuda path (test_cuda_path)": (8 * 4 * 128 * 2, 16),
    **{
        f"bench transfer {key} {dtype}": (shape.bytes_per_token(2 if dtype == "bf16" else 1), shape.block)
        for key, shape in SHAPES.items()
        for dtype in DTYPES
    },
}


@dataclass
class FakeProc:
    """Just enough of psutil.Process for the doctor's engine scan."""

    pid: int
    env: dict[str, str]
    argv: list[str] = field(
        default_factory=lambda: ["python", "-m", "infera.engine.vllm", "--model", "org/model"]
    )

    @contextmanager
    def oneshot(self) -> Iterator[None]:
        yield

    def cmdline(self) -> list[str]:
        return self.argv

    def name(self) -> str:
        return "python"

    def ppid(self) -> int:
        return 1

    def environ(self) -> dict[str, str]:
        return self.env

    def exe(self) -> str:
        raise OSError("not a real process")

    def cwd(self) -> str:
        raise OSError("not a real process")


def doctor_verdict(env: dict[str, str], tmp_path: object) -> Status:
    """The chunk-tokens check on one engine process with this environment."""
    ctx = Context(
        DoctorOptions(root=str(tmp_path)),
        environ={},
        processes=lambda: [FakeProc(4242, {"PYTHONHASHSEED": "0", **env})],  # type: ignore[list-item]
    )
    return chunk_tokens(ctx).status


def lint_hits(env: dict[str, str]) -> dict[str, list[str]]:
    """KVD303 / KVD408 findings about INFERA_KVD_CHUNK_TOKENS on an engine env file with this environment."""
    lines = ["PYTHONHASHSEED=0", "INFERA_KVD_SOCKET=/var/run/infera-kvd.sock"]
    lines += [f"{k}={v}" for k, v in env.items()]
    res = lint_sources([Source("engine.env", "\n".join(lines) + "\n", "env")], select={"KVD303", "KVD408"})
    out: dict[str, list[str]] = {"KVD303": [], "KVD408": []}
    for f in res.findings:
        if KR.CHUNK_TOKENS_ENV in f.message:
            out[f.code].append(f.message)
    return out


# --- the defaults never warn -------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES_USED, ids=list(SHAPES_USED))
@pytest.mark.parametrize("path", PATHS)
def test_what_auto_picks_never_warns_in_doctor_or_lint(shape: str, path: str, tmp_path: object) -> None:
    bytes_per_token, block = SHAPES_USED[shape]
    env = PATHS[path]
    gpu_direct = KR.gpu_direct_in_env(env.get("INFERA_KVD_AIS"), env.get("INFERA_KVD_HIPFILE_ROOTS"))
    assert gpu_direct is (path.startswith("gpu-direct"))
    picked = KR.auto_chunk_tokens(bytes_per_token, block, gpu_direct=bool(gpu_direct))
    pinned = {**env, KR.CHUNK_TOKENS_ENV: str(picked)}  # the user pins what the engine log printed
    assert KR.small_chunk(picked, gpu_direct) is None
    assert doctor_verdict(pinned, tmp_path) is Status.OK
    assert lint_hits(pinned) == {"KVD303": [], "KVD408": []}
    # and leaving it at auto is fine too
    for auto in ({**env}, {**env, KR.CHUNK_TOKENS_ENV: "auto"}):
        assert doctor_verdict(auto, tmp_path) is Status.OK
        assert lint_hits(auto) == {"KVD303": [], "KVD408": []}


def test_the_shapes_used_are_within_the_bound_the_threshold_assumes() -> None:
    assert all(bpt <= KR.MAX_KV_BYTES_PER_TOKEN for bpt, _ in SHAPES_USED.values())


@given(
    bytes_per_token=st.integers(1, KR.MAX_KV_BYTES_PER_TOKEN),
    block=st.sampled_from([1, 4, 16, 32, 64, 128, 256, 544]),
)
def test_auto_never_picks_a_small_gpu_direct_chunk_up_to_the_bound(bytes_per_token: int, block: int) -> None:
    picked = KR.auto_chunk_tokens(bytes_per_token, block, gpu_direct=True)
    assert picked >= KR.SMALL_GPU_DIRECT_TOKENS
    assert KR.small_chunk(picked, True) is None


def test_a_small_fixed_chunk_warns_only_with_gpu_direct(tmp_path: object) -> None:
    small = {KR.CHUNK_TOKENS_ENV: str(KR.SMALL_GPU_DIRECT_TOKENS - 1)}
    assert doctor_verdict({**small, **GPU_DIRECT}, tmp_path) is Status.WARN
    assert len(lint_hits({**small, **GPU_DIRECT})["KVD303"]) == 1
    assert doctor_verdict({**small, **RAM}, tmp_path) is Status.OK
    assert lint_hits({**small, **RAM})["KVD303"] == []


# --- doctor and lint agree ---------------------------------------------------------------------

VALUES = [
    "auto",
    "AUTO",
    "",
    "1",
    "16",
    "64",
    "127",
    "128",
    "256",
    "1000",
    "4096",
    "+64",
    "0",
    "-5",
    "abc",
    "1.5",
]
AIS = [None, "0", "1", "auto", "yes"]
ROOTS = [None, "long=/nvme/kvd-long"]


@pytest.mark.parametrize(("value", "ais", "roots"), list(itertools.product(VALUES, AIS, ROOTS)))
def test_doctor_and_lint_give_the_same_chunk_verdict(
    value: str, ais: str | None, roots: str | None, tmp_path: object
) -> None:
    env = {KR.CHUNK_TOKENS_ENV: value}
    if ais is not None:
        env[KR.AIS_ENV] = ais
    if roots is not None:
        env[KR.ROOTS_ENV] = roots
    verdict = KR.chunk_setting(value, ais, roots)
    expected = Status.FAIL if verdict.error else Status.WARN if verdict.small else Status.OK
    hits = lint_hits(env)
    assert doctor_verdict(env, tmp_path) is expected
    assert bool(hits["KVD408"]) is (expected is Status.FAIL)
    assert bool(hits["KVD303"]) is (expected is Status.WARN)


@pytest.mark.parametrize("ais", ["0", "1", "auto"])
@pytest.mark.parametrize("roots", [None, "", "long=/nvme/kvd-long", "long=/a,scratch=/b"])
def test_the_connector_requests_gpu_direct_exactly_when_the_tools_think_so(
    ais: str, roots: str | None
) -> None:
    env = {"INFERA_KVD_AIS": ais}
    if roots is not None:
        env["INFERA_KVD_HIPFILE_ROOTS"] = roots
    assert read_env(env).gpu_direct_requested is KR.gpu_direct_in_env(ais, roots)


# --- the hash-seed rule ------------------------------------------------------------------------

KTC = """'{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}'"""


def lint_seed(algo: str, version: tuple[int, int] | None) -> str | None:
    """KVD301's severity on one engine leg with PYTHONHASHSEED unset, or None."""
    flag = f" {KR.HASH_ALGO_FLAG} {algo}" if algo != KR.DEFAULT_HASH_ALGO else ""
    script = (
        "#!/bin/sh\nINFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --model m "
        f"--enable-prefix-caching{flag} --kv-transfer-config {KTC}\n"
    )
    res = lint_sources(
        [Source("e.sh", script, "shell")], LintContext(vllm_version=version), select={"KVD301"}
    )
    sev = {str(f.severity) for f in res.findings}
    assert len(sev) <= 1
    return sev.pop() if sev else None


@pytest.mark.parametrize("version", [None, (0, 26), (0, 28), (0, 29), (0, 32)])
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_doctor_and_lint_agree_on_an_unset_seed(version: tuple[int, int] | None, algo: str) -> None:
    mode = KR.hash_seed_mode(None, algo, KR.fixed_seed_release(version))
    eng = EngineProcess(
        pid=1, cmdline=[], kind="infera", seed=None, seed_known=True, chunk_tokens=None, model="m",
        hash_algo=algo, vllm=None,
    )  # fmt: skip
    seed_class, problem = effective_seed(eng, version)
    expected = {"random": ("random", "error"), "unknown": ("unset", "warning"), "fixed": ("fixed", None)}[
        mode
    ]
    assert (seed_class, lint_seed(algo, version)) == expected
    assert (problem is not None) is (mode == "random")


def test_hash_seed_mode_follows_the_research_table() -> None:
    mode = KR.hash_seed_mode
    assert mode("0", "xxhash", False) == "env:0"
    assert mode(None, "sha256", True) == "fixed" and mode(None, "sha256_cbor", True) == "fixed"
    assert mode(None, "sha256", False) == "random" and mode(None, "xxhash", True) == "random"
    assert mode(None, "sha256", None) == "unknown" and mode(None, "xxhash", None) == "random"
    assert KR.fixed_seed_release((0, 28, 9)) is False and KR.fixed_seed_release((0, 29)) is True
    assert KR.fixed_seed_release(None) is None


def test_fingerprint_conflicts_group_by_model_and_skip_undeclared_clients() -> None:
    clients = [
        {"pid": 1, "model": "a", "hash_fingerprint": "f1"},
        {"pid": 2, "model": "a", "hash_fingerprint": "f2"},
        {"pid": 3, "model": "a", "hash_fingerprint": "f1"},
        {"pid": 4, "model": "b", "hash_fingerprint": "f1"},
        {"pid": 5, "model": "b", "hash_fingerprint": ""},
        {"pid": 6, "model": None, "hash_fingerprint": "f9"},
    ]
    got = KR.fingerprint_conflicts(clients)
    assert [(m, {fp: [c["pid"] for c in who] for fp, who in fps.items()}) for m, fps in got] == [
        ("a", {"f1": [1, 3], "f2": [2]})
    ]
