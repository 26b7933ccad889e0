"""A client process for the daemon tests: ``python tests/kvd/worker.py MODE SOCKET ...``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from infera.kvd.client import KvdClient


def payload(key: bytes, size: int) -> bytes:
    seed = hashlib.sha256(key).digest()
    return (seed * (size // 32 + 1))[:size]


def main() -> None:
    mode, sock = sys.argv[1], sys.argv[2]
    if mode == "mix":
        # put my chunks, then read everybody's; report any byte mismatch
        me, workers, per, size = (int(x) for x in sys.argv[3:7])
        mismatches = hits = 0
        with KvdClient(sock, namespace="mix", name=f"w{me}") as c:
            for i in range(per):
                k = f"w{me}-{i}".encode()
                c.put(k, payload(k, size))
            for rnd in range(3):
                for w in range(workers):
                    for i in range(per):
                        k = f"w{w}-{i}".encode()
                        got = c.get(k)
                        if got is None:
                            continue
                        hits += 1
                        if got != payload(k, size):
                            mismatches += 1
                if rnd == 0:
                    time.sleep(0.05)
        print(json.dumps({"hits": hits, "mismatches": mismatches}))
    elif mode == "hold":
        # seal one chunk, reserve another without sealing, lease the first 3 times, then wait
        size = int(sys.argv[3])
        c = KvdClient(sock, namespace="hold", name="holder")
        c.put(b"held", payload(b"held", size))
        c.reserve([b"unsealed"], [size])
        leases = c.lease([b"held", b"held", b"held"])
        assert all(item is not None for item in leases)
        c.ping()
        print("ready", flush=True)
        time.sleep(120)
    elif mode == "setuid":
        os.setgid(65534)
        os.setuid(65534)
        from infera.kvd.client import KvdRefused

        try:
            KvdClient(sock)
        except KvdRefused as exc:
            print(json.dumps({"refused": True, "message": exc.message}))
        else:
            print(json.dumps({"refused": False}))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
