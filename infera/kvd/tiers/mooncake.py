"""``--long-backend mooncake``: the long tier is a Mooncake Store cluster shared by every daemon.

The client is ``mooncake.store.MooncakeDistributedStore`` from the optional ``mooncake`` extra
(``mooncake-transfer-engine-non-cuda`` on hosts without CUDA, ``mooncake-transfer-engine`` on
GPU hosts; never both in one environment). What this module knows about its behaviour:

* ``setup()`` blocks for about 90 s when no master answers, and holds the GIL while it runs (a
  hung master: ~10 minutes). The monitor thread probes the master's port with a short TCP connect,
  then runs the same setup in a child process with a deadline (:mod:`.mooncakesetup`), and only
  then calls it in the daemon; failed setups are retried 1, 2, 4 … 30 s apart (:mod:`.l4link`).
* The whole arena is registered once, then values move with the scatter/gather calls
  (``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``): header from a small
  registered slot, payload straight from or into the arena, no copy in Python.
* ``put`` on an existing key succeeds and keeps the old value (first writer wins), so an
  overwrite removes the key first. ``get`` cannot tell a missing key from an error, so reads go
  through ``get_size`` (``-704`` = missing) and ``get_into`` style calls that return codes.
* ``-200`` means no segment has room (eviction runs asynchronously in the master; a storage node
  that missed its heartbeats for the master's client TTL is unmounted): the write is postponed,
  retried with back-off (:mod:`.writeretry`) and counted as backpressure. Reads take a lease that blocks ``remove`` for a while;
  our removes are forced. A master restart loses every key (the tier rewrites what RAM holds).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera.errors import UsageError
from infera.kvd.flags import parse_master
from infera.kvd.keyspace import mooncake_name
from infera.kvd.tiers.mooncakesetup import ERRORS, NO_RDMA, Settings, SetupProbe, explain, rdma_devices
from infera.kvd.tiers.remote import RemoteTier
from infera.kvd.tiers.transport import HEADER, Region, Transport, TransportError

if TYPE_CHECKING:
    from infera.kvd.config import DaemonConfig
    from infera.kvd.tiers.base import TierHost

log = logging.getLogger("infera.kvd.l4")

PROBE_TIMEOUT_S = 0.5


def code_error(rc: int, what: str) -> TransportError:
    text, kind = ERRORS.get(rc, (f"error {rc}", "error"))
    return TransportError(f"{what}: {text} ({rc})", kind)


def local_address(host: str, port: int) -> str:
    """The address of this host on the route to the master (what peers must use to reach us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
            addr = str(s.getsockname()[0])
        except OSError:
            addr = "127.0.0.1"
    return addr


class MooncakeTransport(Transport):
    backend = "mooncake"

    def __init__(
        self,
        master: str,
        metadata: str,
        protocol: str = "tcp",
        device: str = "",
        segment_bytes: int = 0,
        buffer_bytes: int = 16 << 20,
    ) -> None:
        self.master = master
        self.metadata = metadata
        self.protocol = protocol
        self.device = device
        self.segment_bytes = segment_bytes
        self.buffer_bytes = buffer_bytes
        self.host, self.port = parse_master(master)  # the master, or the first etcd endpoint
        self.endpoint = master
        self._store: Any = None
        self._registered: list[int] = []
        self._sizes: dict[str, int] = {}  # namespace part of a name -> size of its last value
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:
            raise UsageError(
                f"--long-backend mooncake needs the Mooncake client, which does not import here ({exc})",
                hint="pip install 'infera-kvd[mooncake]' (mooncake-transfer-engine-non-cuda) or "
                "mooncake-transfer-engine on CUDA hosts; it needs libibverbs1",
            ) from None
        self._cls = MooncakeDistributedStore
        self._setup_probe = SetupProbe()
        self.no_rdma = protocol == "rdma" and not rdma_devices()
        if self.no_rdma:
            log.warning(
                "--mooncake-protocol rdma: this host has no RDMA devices (/sys/class/infiniband is "
                "empty or missing); Mooncake falls back to TCP"
            )

    @property
    def connected(self) -> bool:
        return self._store is not None

    def probe(self) -> None:
        try:
            socket.create_connection((self.host, self.port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise TransportError(
                f"master {self.host}:{self.port} does not answer ({exc.strerror or exc})", "down"
            ) from None

    def connect(self, arena: Region, slots: Region) -> None:
        local = os.environ.get("MC_TCP_BIND_ADDRESS") or local_address(self.host, self.port)
        # Without it the transfer engine advertises the first non-loopback interface.
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", local)
        settings = Settings(
            local,
            self.metadata,
            self.segment_bytes,
            self.buffer_bytes,
            self.protocol,
            self.device,
            self.master,
        )
        self._setup_probe.check(settings)  # in a child process: setup() here holds the GIL
        store = self._cls()
        rc = store.setup(*settings.setup_args())
        if rc != 0:
            raise TransportError(explain(rc, settings), "down")
        for region in (arena, slots):
            rc = store.register_buffer(region.ptr, region.view.nbytes)
            if rc != 0:
                store.close()
                raise TransportError(f"registering {region.view.nbytes} bytes with Mooncake failed ({rc})")
        self._registered = [arena.ptr, slots.ptr]
        self._store = store

    def _s(self) -> Any:
        store = self._store
        if store is None:
            raise TransportError("not connected", "down")
        return store

    def name(self, digest: bytes, key: bytes) -> str:
        return mooncake_name(digest, key)  # kvd1/<namespace prefix hex>/<key hex>

    def exists(self, name: str) -> bool:
        rc = self._s().is_exist(name)
        if rc < 0:
            raise code_error(rc, "is_exist")
        return rc == 1

    def exists_many(self, names: list[str]) -> list[bool]:
        rcs = list(self._s().batch_is_exist(names))
        if len(rcs) != len(names):
            raise TransportError(f"batch_is_exist answered {len(rcs)} of {len(names)} keys", "error")
        bad = [rc for rc in rcs if rc < 0]
        if bad:
            raise code_error(bad[0], "batch_is_exist")
        return [rc == 1 for rc in rcs]

    def fetch(self, name: str, header: Region, alloc: Callable[[int], Region | None]) -> Region | None:
        store = self._s()
        space = name.rpartition("/")[0]
        guess = self._sizes.get(space)
        if guess is not None:
            # Chunks of one namespace nearly always have one size: try it and skip a get_size
            # round trip; a wrong guess fails cleanly (-600 buffer too small, -800 too large).
            region = alloc(guess - HEADER)
            if region is None:
                return None
            rc = self._get(store, name, header, region, guess)
            if rc == guess:
                return region
            region.view.release()
            if rc not in (-600, -800):
                raise (
                    code_error(rc, "get")
                    if rc < 0
                    else TransportError(f"read {rc} of {guess} bytes", "corrupt")
                )
        size = store.get_size(name)
        if size < 0:
            raise code_error(size, "get_size")
        if size < HEADER:
            raise TransportError(f"a {size}-byte value cannot be a chunk", "corrupt")
        region = alloc(size - HEADER)
        if region is None:
            return None
        rc = self._get(store, name, header, region, size)
        if rc != size:
            region.view.release()
            raise code_error(rc, "get") if rc < 0 else TransportError(f"read {rc} of {size} bytes", "corrupt")
        self._sizes[space] = size
        return region

    @staticmethod
    def _get(store: Any, name: str, header: Region, region: Region, size: int) -> int:
        ptrs, sizes = [header.ptr], [HEADER]
        if size > HEADER:
            ptrs.append(region.ptr)
            sizes.append(size - HEADER)
        return int(store.batch_get_into_multi_buffers([name], [ptrs], [sizes])[0])

    def put(self, name: str, header: Region, payload: Region, replace: bool) -> None:
        store = self._s()
        if replace:
            store.remove(name, True)
        ptrs, sizes = [header.ptr], [HEADER]
        if payload.view.nbytes:
            ptrs.append(payload.ptr)
            sizes.append(payload.view.nbytes)
        rc = store.batch_put_from_multi_buffers([name], [ptrs], [sizes])[0]
        if rc < 0:
            raise code_error(rc, "put")

    def remove(self, name: str) -> bool:
        rc = self._s().remove(name, True)
        if rc == 0:
            return True
        if rc == -704:
            return False
        raise code_error(rc, "remove")

    def interrupt(self) -> None:
        self._setup_probe.interrupt()

    def close(self) -> None:
        store, self._store = self._store, None
        if store is None:
            return
        for ptr in self._registered:
            store.unregister_buffer(ptr)
        store.close()


class MooncakeTier(RemoteTier):
    """``--long-backend mooncake`` (flags ``--mooncake-*``, see docs/l4.md)."""

    backend = "mooncake"

    def __init__(self, cfg: DaemonConfig, host: TierHost) -> None:
        assert cfg.mooncake_master is not None  # build_config checked the flags
        transport = MooncakeTransport(
            cfg.mooncake_master,
            cfg.mooncake_metadata,
            cfg.mooncake_protocol,
            cfg.mooncake_device,
            cfg.mooncake_segment_bytes,
            cfg.mooncake_buffer_bytes,
        )
        super().__init__(cfg, host, transport)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        t = self.t
        assert isinstance(t, MooncakeTransport)
        protocol = f"{t.protocol} ({NO_RDMA})" if t.no_rdma else t.protocol
        out.update({"metadata": t.metadata, "protocol": protocol, "segment_bytes": t.segment_bytes})
        return out


__all__ = ["MooncakeTier", "MooncakeTransport"]
