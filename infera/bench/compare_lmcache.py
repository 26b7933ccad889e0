"""LMCache's disk tiers across a restart, for ``kvd bench compare``: runs in a Python with lmcache.

``python -m infera.bench.compare_lmcache write|read BACKEND DIR N CHUNK_BYTES``

* ``write`` stores N chunks of CHUNK_BYTES through LMCache's own storage classes (no engine: its
  vLLM integration cannot start on this CPU) and waits until every chunk is on disk.
* ``read`` is a new process, as after a restart: it builds the same backend on the same directory
  and reads the last chunk written until that succeeds or ``READ_WAIT_S`` passes. It prints the
  seconds from the process start (``/proc/self/stat``) to the first hit, or that there was none,
  and how many chunk files were on disk.

BACKEND is ``local_disk`` (``LocalDiskBackend``, LMCache's local disk tier: the vLLM integration's
``local_disk`` setting) or ``fs`` (``FSConnector``, its ``fs://`` remote tier, one file per key).
Prints ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

READ_WAIT_S = 5.0
MODEL = "kvd-bench"


def _process_age_s() -> float:
    """Seconds since this process started (the clock the parent's spawn time is on)."""
    with open("/proc/self/stat") as fh:
        start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    mode, backend, root, count, size = (
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    for k, v in (("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1"), ("LMCACHE_DISABLE_BANNER", "1")):
        os.environ.setdefault(k, v)
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    imported_s = _process_age_s()
    elems = size // 2  # bf16
    shape = torch.Size([2, 1, 256, elems // 512])  # KV_2LTD: K/V, layers, tokens, hidden
    cfg_kw: dict[str, Any] = {
        "chunk_size": 256,
        "local_cpu": False,
        "max_local_cpu_size": max(0.25, 4 * size / 2**30),
    }
    if backend == "local_disk":
        cfg_kw.update(local_disk=root, max_local_disk_size=max(1.0, 2 * count * size / 2**30))
    cfg = LMCacheEngineConfig.from_defaults(**cfg_kw)
    meta = LMCacheMetadata(
        model_name=MODEL,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(1, 2, 256, 1, elems // 512),
        chunk_size=256,
    )
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    cpu = LocalCPUBackend(cfg, metadata=meta, dst_device="cpu")
    store: Any
    if backend == "local_disk":
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        store = LocalDiskBackend(cfg, loop, cpu, dst_device="cpu", metadata=meta)

        def has(key: Any) -> bool:
            return bool(store.contains(key))

        def fetch(key: Any) -> bool:
            return store.get_blocking(key) is not None
    else:
        from lmcache.v1.storage_backend.connector.fs_connector import FSConnector

        store = FSConnector(loop, cpu, cfg, base_paths_str=root)

        def has(key: Any) -> bool:
            return bool(store.exists_sync(key))

        def fetch(key: Any) -> bool:
            return asyncio.run_coroutine_threadsafe(store.get(key), loop).result() is not None

    keys = [CacheEngineKey(MODEL, 1, 0, i + 1, torch.bfloat16) for i in range(count)]
    out: dict[str, Any] = {"backend": backend, "chunks": count, "import_s": imported_s}
    if mode == "write":
        t = time.perf_counter()
        for key in keys:
            obj = cpu.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD)
            assert obj is not None
            obj.tensor.fill_(1)  # type: ignore[union-attr]
            if backend == "local_disk":
                store.submit_put_task(key, obj)
            else:
                asyncio.run_coroutine_threadsafe(store.put(key, obj), loop).result()
            obj.ref_count_down()
        deadline = time.monotonic() + 600
        while not all(has(k) for k in keys[-8:]) and time.monotonic() < deadline:
            time.sleep(0.01)
        if backend == "local_disk":  # its writes are asynchronous: wait for the files themselves
            while sum(1 for _ in os.scandir(store.path)) < count and time.monotonic() < deadline:
                time.sleep(0.01)
        out["write_s"] = time.perf_counter() - t
        out["stored"] = sum(1 for k in keys if has(k))
    else:
        deadline = time.monotonic() + READ_WAIT_S
        found = False
        while not found and time.monotonic() < deadline:
            found = fetch(keys[-1])
            if not found:
                time.sleep(0.01)
        out["first_hit_s"] = _process_age_s() if found else None
        out["found"] = sum(1 for k in keys if has(k))
        path = getattr(store, "path", root)
        out["files_on_disk"] = sum(len(files) for _d, _s, files in os.walk(path))
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
