"""Stand-in for `python` in the emitted scripts: runs the real kvd daemon, records engine commands.

The launch tests put a `python` shim first on PATH that runs this file. A daemon command
(`python -m infera.kvd ...`) is handed to the real interpreter, so the script really starts a daemon;
an engine command is recorded (argv, environment, whether the daemon answered on its socket) as JSON
under $KVD_STUB_RECORDS and the stub exits 0, as an engine that was stopped would.
"""

from __future__ import annotations

import json
import os
import sys

REAL = os.environ["KVD_STUB_REAL_PYTHON"]


def main() -> None:
    args = sys.argv[1:]
    if args[:2] == ["-m", "infera.kvd"]:
        os.execv(REAL, [REAL, *args])
    record: dict[str, object] = {"argv": ["python", *args], "env": dict(os.environ)}
    sock = os.environ.get("INFERA_KVD_SOCKET")
    if sock:
        from infera.kvd.client import KvdClient, KvdClientError

        try:
            with KvdClient(sock, want_arena=False, timeout=5.0) as client:
                client.ping()
            record["daemon_answered"] = True
        except KvdClientError as exc:
            record["daemon_answered"] = f"no: {exc}"
    out = os.path.join(os.environ["KVD_STUB_RECORDS"], f"{os.getpid()}.json")
    with open(out + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.rename(out + ".tmp", out)


if __name__ == "__main__":
    main()
