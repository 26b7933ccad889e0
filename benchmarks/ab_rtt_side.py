"""One side of benchmarks/ab_rtt.py: a daemon and a client of one tree, timing one operation.

Started with PYTHONPATH set to its tree (so it must run on older trees too: only the client API
every revision has). Prints ``ready``, then for each ``go`` line on stdin times ``--batch`` calls
and prints their median in microseconds; stops at end of input.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from infera.kvd.client import KvdClient

OPS = ("get", "ping", "lookup1000", "put")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=OPS)
    ap.add_argument("--batch", type=int, default=200)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvd-abrtt-", dir="/tmp")
    sock = os.path.join(tmp, "kvd.sock")
    cmd = [sys.executable, "-m", "infera.kvd", "--socket", sock, "--max-bytes", str(256 << 20)]
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                c = KvdClient(sock, namespace="ab", name="ab-rtt")
                break
            except Exception:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    print("daemon did not start", file=sys.stderr)
                    return 1
                time.sleep(0.05)
        key = b"k" * 32
        c.put(key, b"v" * 4096)
        keys = [i.to_bytes(4, "big") * 8 for i in range(1000)]
        c.put_many([(k, b"x" * 64) for k in keys], retention="short")
        n = 0

        def put() -> None:
            nonlocal n
            n += 1
            c.put(n.to_bytes(8, "big") * 4, b"p" * 4096, retention="short")

        call = {
            "get": lambda: c.get(key),
            "ping": c.ping,
            "lookup1000": lambda: c.lookup(keys),
            "put": put,
        }[a.op]
        for _ in range(50):  # warm-up
            call()
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                break
            times = []
            for _ in range(a.batch):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            print(f"{statistics.median(times) * 1e6:.3f}", flush=True)
        c.close()
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
