"""Behaviour of a real daemon process, driven by real client processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import Daemon, free_port
from infera.kvd.client import KvdClient, KvdProtocolError, KvdUnavailable, KvdUnsupported

WORKER = str(Path(__file__).with_name("worker.py"))


def test_put_get_roundtrip_and_counters(daemon: Daemon) -> None:
    with daemon.client(namespace="ns") as c:
        assert c.put(b"k1", b"hello world") is True
        assert c.get(b"k1") == b"hello world"
        assert c.get(b"missing") is None
        buf = bytearray(32)
        assert c.get_into(b"k1", buf) == 11 and bytes(buf[:11]) == b"hello world"
        assert c.lookup([b"k1", b"missing", b"k1"]) == 1
        st = c.stats()
    assert (st["sets_total"], st["gets_total"], st["hits_total"], st["misses_total"]) == (1, 3, 2, 1)
    assert st["bytes_in_total"] == 11 and st["chunks"] == 1
    assert st["arena_bytes_capacity"] == 64 << 20


def test_namespaces_never_see_each_other(daemon: Daemon) -> None:
    with daemon.client(namespace="model-a") as a, daemon.client(namespace="model-b") as b:
        a.put(b"same-key", b"A")
        assert b.get(b"same-key") is None and b.lookup([b"same-key"]) == 0
        b.put(b"same-key", b"B")
        assert a.get(b"same-key") == b"A" and b.get(b"same-key") == b"B"


def test_concurrent_client_processes_get_exact_bytes(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "128M")
    workers, per, size = 4, 40, 256 << 10  # 40 MiB in all: no eviction
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "mix", d.socket, str(w), str(workers), str(per), str(size)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(r["mismatches"] for r in results) == 0
    with d.client() as c:
        st = c.stats()
    assert st["sets_total"] == workers * per
    # every worker saw at least its own chunks on the final two rounds
    assert all(r["hits"] >= 2 * per for r in results)


def test_leased_chunk_survives_eviction_pressure(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "4M")
    with d.client(namespace="p") as reader, d.client(namespace="p") as writer:
        data = os.urandom(256 << 10)
        reader.put(b"precious", data, retention="short")
        (lease,) = reader.lease([b"precious"])
        assert lease is not None
        token, off, length = lease
        for i in range(64):  # 16 MiB of long chunks through a 4 MiB arena
            writer.put(b"filler-%d" % i, os.urandom(256 << 10))
        assert bytes(reader.arena[off : off + length]) == data
        assert reader.get(b"precious") == data
        reader.release([token])
        for i in range(64, 80):
            writer.put(b"filler-%d" % i, os.urandom(256 << 10))
        st = writer.stats()
    assert st["evictions_total"] > 0
    assert st["evictions_by_class"]["short"] >= 1  # once released, the short chunk went first


def test_kill9_of_a_client_returns_its_leases_and_reservations(daemon: Daemon) -> None:
    size = 1 << 20
    with daemon.client(namespace="hold") as c:
        base = c.stats()["arena_bytes_used"]
        holder = subprocess.Popen(
            [sys.executable, WORKER, "hold", daemon.socket, str(size)], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        st = c.stats()
        assert st["arena_bytes_used"] == base + 2 * size  # sealed + unsealed reservation
        assert {cl["name"]: cl["leases"] for cl in st["clients"]}["holder"] == 3
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        deadline = time.monotonic() + 5
        while c.stats()["reservations"] and time.monotonic() < deadline:
            time.sleep(0.02)
        st = c.stats()
        assert st["reservations"] == 0 and st["arena_bytes_used"] == base + size
        # the leases are gone too: deleting the sealed chunk frees its bytes at once
        assert c.delete([b"held"]) == 1
        assert c.stats()["arena_bytes_used"] == base


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client under another uid")
def test_uid_not_allowed_is_refused(start_daemon: Callable[..., Daemon], short_tmp: Path) -> None:
    os.chmod(short_tmp, 0o755)
    d = start_daemon("--max-bytes", "8M", "--socket-mode", "0666")
    out = subprocess.run(
        [sys.executable, WORKER, "setuid", d.socket], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["refused"] is True and "65534" in res["message"]
    with d.client() as c:
        assert c.stats()["refused_total"] == 1
    d2 = start_daemon("--max-bytes", "8M", "--socket-mode", "0666", "--allow-uid", "65534", name="allowed")
    out = subprocess.run(
        [sys.executable, WORKER, "setuid", d2.socket], capture_output=True, text=True, timeout=60
    )
    assert json.loads(out.stdout)["refused"] is False


def test_second_daemon_on_a_live_socket_refuses(daemon: Daemon) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--socket", daemon.socket, "--max-bytes", "8M"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert "already serving" in out.stderr and str(daemon.pid) in out.stderr
    assert "Traceback" not in out.stderr
    with daemon.client() as c:
        assert c.ping()


def test_stale_socket_file_is_replaced(short_tmp: Path) -> None:
    path = str(short_tmp / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # leaves the file behind, nobody listening
    d = Daemon(path, ["--max-bytes", "8M"], short_tmp / "stale.log").start()
    try:
        with d.client() as c:
            assert c.ping()
        assert "stale socket" in d.log()
    finally:
        d.stop()


def test_sigterm_shuts_down_cleanly(daemon: Daemon) -> None:
    assert daemon.stop() == 0
    assert not os.path.exists(daemon.socket)
    assert "shutting down" in daemon.log() and "Traceback" not in daemon.log()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-bytes", "12X"], "--max-bytes: '12X' is not a size"),
        (["--max-bytes", "10K"], "below the 1M minimum"),
        (["--long-path", "/tmp/x", "--long-bytes", "1G", "--long-backend", "mooncake"], "never both"),
        (["--long-bytes", "1G"], "--long-bytes needs --long-path"),
        (["--socket-mode", "99"], "not an octal mode"),
        (["--log-level", "loud"], "--log-level"),
        (["--long-backend", "floppy"], "--long-backend"),
        (["--busy-poll-us", "-5"], "--busy-poll-us"),
        (["--max-bytes", "1000T"], "is more than this host's memory"),
        (
            ["--socket", "/tmp/" + "s" * 98 + ".sock"],
            "the path is 108 bytes; a Unix socket path has at most 107",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(args: list[str], needle: str, short_tmp: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--socket", str(short_tmp / "x.sock"), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2, out.stderr
    first = out.stderr.strip().splitlines()[0]
    assert first.startswith("error: ") and needle in first
    assert "Traceback" not in out.stderr


def test_a_start_that_fails_after_the_flags_is_one_line(short_tmp: Path) -> None:
    """A start that fails at run time (here the socket's directory is a file) prints the error
    and its hint only: no "shutting down" log line for a daemon that never served."""
    (short_tmp / "afile").write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--socket", str(short_tmp / "afile" / "x.sock")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert lines and all(ln.startswith(("error: ", "hint: ")) for ln in lines), out.stderr
    assert "is a regular file, not a directory" in lines[0]


def test_an_arena_the_kernel_will_not_map_is_one_line(short_tmp: Path) -> None:
    """Below the host's RAM but above the process's address-space limit (``ulimit -v``): the
    mmap fails with ENOMEM, which the daemon reports in one line instead of a traceback."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd", "--socket", str(short_tmp / "x.sock"), "--max-bytes", "2G"],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=limit,
    )
    assert out.returncode == 1, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(("error: ", "hint: "))]
    assert lines[0] == "error: --max-bytes 2.0 GiB: cannot map the arena: Cannot allocate memory", out.stderr
    assert "Traceback" not in out.stderr


def test_prewarm_without_long_tier_says_so(daemon: Daemon) -> None:
    with daemon.client() as c, pytest.raises(KvdUnsupported, match="long tier"):
        c.prewarm([b"k"])


def test_unreachable_daemon_is_one_clear_error(short_tmp: Path) -> None:
    with pytest.raises(KvdUnavailable, match="no kvd daemon"):
        KvdClient(str(short_tmp / "nothing.sock"))
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd.statctl", "--socket", str(short_tmp / "nothing.sock")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and out.stderr.startswith("error: no kvd daemon") and out.stdout == ""


def test_a_bad_spin_setting_names_the_variable(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``INFERA_KVD_SPIN_US=abc`` used to mean "no polling" without a word; the connector refused
    it while tools took it: one parser now (``infera.kvd.clientnet.parse_spin_us``)."""
    from infera.errors import UsageError

    monkeypatch.setenv("INFERA_KVD_SPIN_US", "abc")
    with pytest.raises(UsageError, match="INFERA_KVD_SPIN_US='abc' is not a whole number"):
        KvdClient(str(short_tmp / "nothing.sock"))


def test_a_path_that_is_not_a_socket_says_what_it_is(short_tmp: Path) -> None:
    """connect() on a regular file answers ECONNREFUSED, which read as "is the daemon running?"."""
    plain = short_tmp / "kvd.sock"
    plain.write_text("not a socket")
    with pytest.raises(KvdUnavailable, match="is not a kvd socket: it is a regular file"):
        KvdClient(str(plain))
    with pytest.raises(KvdUnavailable, match="is not a kvd socket: it is a directory"):
        KvdClient(str(short_tmp))


def test_statctl_text_and_json(daemon: Daemon) -> None:
    with daemon.client(namespace="n") as c:
        c.put(b"a", b"1")
        c.get(b"a")
        out = subprocess.run(
            [sys.executable, "-m", "infera.kvd.statctl", "--socket", daemon.socket, "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        data = json.loads(out.stdout)
        assert {k: data[k] for k in ("sets_total", "gets_total", "hits_total", "misses_total")} == {
            "sets_total": 1,
            "gets_total": 1,
            "hits_total": 1,
            "misses_total": 0,
        }
        text = subprocess.run(
            [sys.executable, "-m", "infera.cli", "stat", "--socket", daemon.socket],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    assert "sets_total              1" in text and "misses_total            0" in text


def test_hash_setting_disagreement_is_a_warning(daemon: Daemon) -> None:
    kw = {"model": "llama-8b", "namespace": "x"}
    with (
        daemon.client(hash_fingerprint="sha256/seed=0", **kw),
        daemon.client(hash_fingerprint="sha256/seed=unset", **kw) as c,
    ):
        warnings = c.stats()["warnings"]
    assert len(warnings) == 1 and "llama-8b" in warnings[0] and "seed=unset" in warnings[0]


def test_metrics_endpoint(start_daemon: Callable[..., Daemon]) -> None:
    port = free_port()
    d = start_daemon("--max-bytes", "8M", "--metrics-port", str(port))
    with d.client() as c:
        c.put(b"m", b"x" * 100)
        c.get(b"m")
    time.sleep(1.2)  # the snapshot is refreshed once a second
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "# TYPE kvd_sets_total counter" in body
    assert "kvd_sets_total 1" in body and "kvd_hits_total 1" in body
    assert 'kvd_tier_capacity_bytes{tier="ram"}' in body


def test_protocol_errors_are_typed_and_the_connection_survives(daemon: Daemon) -> None:
    with daemon.client() as c:
        with pytest.raises(KvdProtocolError) as e1:
            c.request("FROB")
        assert e1.value.code == "unknown_op"
        with pytest.raises(KvdProtocolError) as e2:
            c.request("GET", keys=[b""])
        assert e2.value.code == "bad_request"
        with pytest.raises(KvdProtocolError):
            c.request("PUT", keys=[b"a"], lengths=[1, 2])
        with pytest.raises(KvdProtocolError):
            c.request("LOOKUP", keys="notalist")
        with pytest.raises(ValueError):
            c.put(b"x" * 65, b"too long key")
        assert c.ping()


def test_get_into_too_small_buffer_writes_nothing(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.put(b"big", b"z" * 100)
        buf = bytearray(10)
        with pytest.raises(ValueError, match="too small"):
            c.get_into(b"big", buf)
        assert buf == bytearray(10)
        assert c.stats()["clients"][0]["leases"] == 0


def test_overwrite_replaces_and_plain_put_keeps_first(daemon: Daemon) -> None:
    with daemon.client() as c:
        assert c.put(b"k", b"first") is True
        assert c.put(b"k", b"second") is False
        assert c.get(b"k") == b"first"
        assert c.put(b"k", b"third", overwrite=True) is True
        assert c.get(b"k") == b"third"


def test_none_retention_stores_nothing(daemon: Daemon) -> None:
    with daemon.client() as c:
        assert c.put(b"n", b"data", retention="none") is False
        assert c.get(b"n") is None and c.stats()["put_none_total"] == 1


def test_daemon_starts_from_the_kvd_cli(short_tmp: Path) -> None:
    cli = [sys.executable, "-m", "infera.cli", "serve"]
    d = Daemon(str(short_tmp / "cli.sock"), ["--max-bytes", "8M"], short_tmp / "cli.log", command=cli)
    d.start()
    assert d.stop() == 0


def test_demo_runs_end_to_end() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infera.cli", "demo", "--chunks", "8", "--chunk-size", "64K"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("8 verified byte for byte") == 2, out.stdout  # before and after the restart
    assert "served from disk" in out.stdout and "demo passed" in out.stdout


def test_prefault_commits_the_arena_in_the_background(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "32M", "--prefault")
    deadline = time.monotonic() + 10
    while "arena prefaulted" not in d.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "arena prefaulted: 32 MiB" in d.log()
    with d.client() as c:
        assert c.put(b"k", b"v") and c.get(b"k") == b"v"
    assert d.stop() == 0


def test_busy_poll_off_still_serves(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--max-bytes", "8M", "--busy-poll-us", "0")
    with d.client() as c:
        assert c.put(b"k", b"v") and c.get(b"k") == b"v" and c.ping()


def test_tools_without_the_arena_show_no_data_path(daemon: Daemon) -> None:
    with daemon.client(name="engine") as engine, daemon.client(name="tool", want_arena=False) as tool:
        engine.ping()
        paths = {c["name"]: c["data_path"] for c in tool.stats()["clients"]}
    assert paths == {"engine": "arena", "tool": "none"}
