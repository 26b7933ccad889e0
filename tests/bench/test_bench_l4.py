"""``kvd bench l4`` against a store that refuses writes for a while, and the one-line account of a
throwaway store that the benchmark attaches to its errors (real master, real storage node)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infera.bench.services import MooncakeMaster, MooncakeStorageNode, Service, find_program
from infera.kvd.process import wait_until

needs_mooncake = pytest.mark.skipif(
    find_program("mooncake_master") is None, reason="mooncake_master is not installed"
)


@needs_mooncake
def test_bench_l4_waits_for_writes_the_store_refused_and_counts_them(
    services: Callable[[Service], Service], service_dir: Path, mooncake_master: MooncakeMaster
) -> None:
    # No storage node yet: the master has no room, so every put is refused with -200 ("full").
    # The daemon retries them; once a node mounts its segment they land, and the run says so.
    argv = [sys.executable, "-m", "infera.cli", "bench", "l4", "--chunk-size", "256K", "--count", "4"]
    argv += ["--rounds", "1", "--batch", "2", "--json"]
    argv += ["--master", mooncake_master.address, "--metadata", mooncake_master.metadata]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as bench:
        wait_until(
            lambda: "failed allocations 0" not in mooncake_master.describe(),
            60,
            "a refused put",
            poll_s=0.1,
        )
        services(MooncakeStorageNode(service_dir, mooncake_master))
        out, err = bench.communicate(timeout=120)
    assert bench.returncode == 0, err[-2000:]
    res = json.loads(out)
    assert res["postponed_writes"] >= 1
    assert len(res["put_ratio_rounds"]) == 1 and res["kvd_put_mib_s"] > 0


@needs_mooncake
def test_master_describe_tells_of_a_storage_node_that_stopped_answering(
    services: Callable[[Service], Service], service_dir: Path
) -> None:
    master = MooncakeMaster(service_dir, client_ttl_s=2)
    node = MooncakeStorageNode(service_dir, master)
    services(master)
    services(node)
    healthy = master.describe()
    assert "capacity bytes 134217728" in healthy and "clients expired 0" in healthy, healthy
    # A stalled node misses its heartbeats; past the master's client TTL (2 s here) its
    # segment is unmounted: the state that refuses every put with -200 ("no mounted segment has room").
    os.kill(node.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: "clients expired 1" in master.describe(), 30, "the node to expire", poll_s=0.1)
        assert "capacity bytes 0" in master.describe()
    finally:
        os.kill(node.pid, signal.SIGCONT)
    # resumed, it remounts its segment (empty) on its next ping
    wait_until(lambda: "capacity bytes 134217728" in master.describe(), 30, "the node to remount", poll_s=0.1)


@needs_mooncake
def test_master_describe_says_when_the_master_is_gone(mooncake_master: MooncakeMaster) -> None:
    mooncake_master.stop()
    assert "did not answer" in mooncake_master.describe()


@needs_mooncake
def test_a_cluster_that_cannot_start_is_one_line_error(tmp_path: Path) -> None:
    from infera.bench.services import mooncake_cluster
    from infera.errors import KvdError

    with pytest.raises(KvdError) as err, mooncake_cluster(tmp_path, "99999999 GB"):  # more than any host
        pass
    assert "\n" not in err.value.message and "mooncake_client" in err.value.message, err.value.message
    assert err.value.hint is not None and "INVALID_PARAMS" in err.value.hint, err.value.hint


@pytest.mark.parametrize(
    ("master", "rc", "says"),
    [("127.0.0.1:{port}", 1, "does not answer"), ("no-port-here", 2, "is not HOST:PORT")],
)
def test_bench_l4_refuses_a_master_that_is_not_there_at_once(master: str, rc: int, says: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "infera.cli",
            "bench",
            "l4",
            "--master",
            master.format(port=port),
            "--count",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == rc and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 20  # not after the daemons' 30 s wait for their tier
