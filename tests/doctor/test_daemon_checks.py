"""Checks that read a real kvd daemon: reachability, counters, and what its clients declared."""

from __future__ import annotations

import os

from infera.doctor.context import Context, DoctorOptions
from infera.doctor.run import run_doctor


def _run(sock: str | None, *checks: str, explicit: bool = True):
    opts = DoctorOptions(root="/", socket=sock, socket_explicit=explicit, checks=list(checks))
    return run_doctor(ctx=Context(opts, processes=lambda: []))


def _engine(daemon, name: str, fp: str, chunk: int, model: str = "Qwen/Qwen3-0.6B", seed: str | None = "0"):
    return daemon.client(
        name=name,
        role="scheduler",
        model=model,
        namespace=f"{model}|{fp}|{chunk}",
        hash_settings={"algo": "sha256", "pythonhashseed": seed, "block_size": 16},
        hash_fingerprint=fp,
        chunk_tokens=chunk,
        want_arena=False,
    )


def test_daemon_reachable_with_counters(daemon):
    with daemon.client(name="writer") as c:
        c.put(b"k" * 32, b"x" * 4096)
        assert c.get(b"k" * 32) == b"x" * 4096
        r = _run(daemon.socket, "daemon").get("daemon").result
    assert r.status.value == "ok"
    assert "kvd 0.1.0" in r.summary and "hits 1" in r.summary and "misses 0" in r.summary
    assert any(e.value.startswith("sets_total 1") for e in r.evidence)


def test_misses_are_explained_with_likely_causes(daemon):
    with daemon.client(name="reader") as c:
        c.put(b"a" * 32, b"y" * 4096)
        c.get(b"a" * 32)
        assert c.get(b"b" * 32) is None
        r = _run(daemon.socket, "daemon").get("daemon").result
    assert r.status.value == "warn" and "misses_total 1" in r.summary
    assert r.details[0].startswith("likely causes")
    assert any("PYTHONHASHSEED" in d for d in r.details) and any("CHUNK_TOKENS" in d for d in r.details)


def test_engines_declaring_different_hash_settings_fail_by_name(daemon):
    a = _engine(daemon, "prefill", "fp-seed0", 256)
    b = _engine(daemon, "decode", "fp-unset", 256, seed=None)
    try:
        rep = _run(daemon.socket, "hash-settings", "daemon")
    finally:
        a.close()
        b.close()
    hs = rep.get("hash-settings").result
    assert hs.status.value == "fail"
    assert "fp-seed0" in hs.summary and "fp-unset" in hs.summary
    assert "prefill" in hs.summary and "decode" in hs.summary
    assert any("pythonhashseed=0" in e.value for e in hs.evidence)
    d = rep.get("daemon").result
    assert d.status.value == "warn" and "disagree on hash settings" in d.summary


def test_engines_agreeing_pass(daemon):
    a = _engine(daemon, "prefill", "fp-same", 2048)
    b = _engine(daemon, "decode", "fp-same", 2048)
    try:
        rep = _run(daemon.socket, "hash-settings", "chunk-tokens")
    finally:
        a.close()
        b.close()
    assert rep.get("hash-settings").result.status.value == "ok"
    assert rep.get("chunk-tokens").result.status.value == "ok"


def test_declared_chunk_sizes_differing_for_one_model_fail(daemon):
    a = _engine(daemon, "e1", "fp", 256)
    b = _engine(daemon, "e2", "fp", 1024)
    c = _engine(daemon, "e3", "fp", 4096, model="other")
    try:
        r = _run(daemon.socket, "chunk-tokens").get("chunk-tokens").result
    finally:
        for x in (a, b, c):
            x.close()
    assert r.status.value == "fail"
    assert "e1" in r.summary and "e2" in r.summary and "other" not in r.summary


def test_explicit_socket_that_is_not_there_fails(short_tmp):
    rep = _run(str(short_tmp / "nothing.sock"), "daemon")
    r = rep.get("daemon").result
    assert r.status.value == "fail" and "nothing.sock" in r.summary and r.fix
    assert rep.exit_code == 1


def test_default_socket_absent_is_a_skip(short_tmp, monkeypatch):
    monkeypatch.setenv("INFERA_KVD_SOCKET", str(short_tmp / "absent.sock"))
    r = _run(None, "daemon", explicit=False).get("daemon").result
    assert r.status.value == "skip" and "--socket" in r.summary


def test_stopped_daemon_leaves_a_stale_default_socket_warn(start_daemon, monkeypatch):
    d = start_daemon("--max-bytes", "16M", name="stale")
    d.kill()
    monkeypatch.setenv("INFERA_KVD_SOCKET", d.socket)
    r = _run(None, "daemon", explicit=False).get("daemon").result
    assert r.status.value == "warn" and "cannot reach" in r.summary


def _halves(daemon, fp: str, seed: str, vllm: str = "0.26", model: str = "/m/tiny"):
    """One engine as the connector declares it: its scheduler and worker halves in one process
    (an ``LLM(...)`` script), whose command line the process scan does not recognise."""
    settings = {"algo": "sha256", "seed": seed, "block_size": 16}
    return [
        daemon.client(
            name="vllm:tiny",
            role=role,
            model=model,
            namespace=f"vllm/tiny/{fp}",
            hash_settings=settings,
            hash_fingerprint=fp,
            chunk_tokens=256,
            kv_layout={"tp": 1, "rank": 0, "vllm": vllm},
            want_arena=False,
        )
        for role in ("vllm-scheduler", "vllm-worker-0")
    ]


def test_a_daemon_client_that_declared_a_random_seed_fails(daemon):
    halves = _halves(daemon, "random-0a1b2c3d4e5f", "random")
    try:
        r = _run(daemon.socket, "hash-settings").get("hash-settings").result
    finally:
        for c in halves:
            c.close()
    assert r.status.value == "fail", r.summary
    assert "declared a random hash seed" in r.summary
    assert "vLLM 0.26 draws a random seed per process when PYTHONHASHSEED is unset" in r.summary
    assert r.summary.count("vllm:tiny pid") == 1, "one engine, named once"
    assert r.fix and str(os.getpid()) in r.fix


def test_the_halves_of_one_engine_count_as_one_engine(daemon):
    halves = _halves(daemon, "24b63a5dfffe", "fixed", vllm="0.32")
    try:
        r = _run(daemon.socket, "hash-settings").get("hash-settings").result
    finally:
        for c in halves:
            c.close()
    assert r.status.value == "ok", r.summary
    assert r.summary.startswith("1 engine(s) agree"), r.summary


def test_hash_mismatch_warning_names_each_process_once(daemon):
    one = _halves(daemon, "24b63a5dfffe", "fixed", vllm="0.32")
    other = _engine(daemon, "other", "fp-other", 256, model="/m/tiny")
    try:
        warnings = daemon.stats()["warnings"]
        r = _run(daemon.socket, "hash-settings").get("hash-settings").result
    finally:
        for c in (*one, other):
            c.close()
    pid = f"pid {os.getpid()}"
    (text,) = [w for w in warnings if "disagree on hash settings" in w]
    assert f"24b63a5dfffe: {pid};" in text and f"{pid}, {pid}" not in text, text
    assert "24b63a5dfffe: vllm:tiny " + pid + ";" in r.summary, r.summary
