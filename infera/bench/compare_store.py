"""Store throughput for ``kvd bench compare``: one client, one request at a time, each store in its
own process on loopback.

Every peer is driven the same way by :func:`measure`: put ``count`` chunks under fresh keys, then
read each back into one preallocated buffer, after one untimed round (first-touch page faults of
the server's memory are not the store's cost). The best of ``rounds`` is kept for each direction.

* **kvd**: the daemon's arena through :class:`~infera.kvd.client.KvdClient` (``put``: reserve, one
  copy into the shared arena, seal; ``get_into``: lease, one copy out, release).
* **Mooncake Store**: ``put_from`` / ``get_into`` of registered memory, a client with no segment of
  its own, so the data lives in a ``mooncake_client`` storage node (TCP transport).
* **lmcache_server**: its wire protocol on a plain socket (a PUT has no reply; the round ends with
  a HEALTH request so that every byte has arrived).
* **Redis**: ``SET`` / ``GET`` over RESP on a plain socket, the reply read into the buffer.
* **memcpy**: in one process, one copy per chunk into (put) and out of (get) a region as large as
  the data the stores hold: the least work a put or a get can do, the limit.

``python -m infera.bench.compare_store PEER ARGS.json`` runs one peer in a fresh process and
prints ``RESULT {json}`` (the orchestrator starts the servers).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

from infera.kvd.tiers.lmcache import EXIST, GET, HEALTH, OK, PUT, REPLY, recv_into, request


class Peer(Protocol):
    def prepare(self, src: bytearray, dst: bytearray) -> None: ...
    def put(self, key: str, src: memoryview) -> None: ...
    def get_into(self, key: str, dst: memoryview) -> int: ...
    def finish_puts(self) -> None: ...
    def delete(self, keys: Sequence[str]) -> None: ...
    def close(self) -> None: ...


class StoreError(RuntimeError):
    pass


class KvdPeer:
    def __init__(self, socket_path: str) -> None:
        from infera.kvd.client import KvdClient

        self.c = KvdClient(socket_path, namespace="bench-compare", name="kvd-bench-compare")

    def prepare(self, src: bytearray, dst: bytearray) -> None:
        pass

    def put(self, key: str, src: memoryview) -> None:
        if not self.c.put(key.encode(), src, retention="short"):
            raise StoreError(f"kvd did not store {key}")

    def get_into(self, key: str, dst: memoryview) -> int:
        return self.c.get_into(key.encode(), dst) or 0

    def finish_puts(self) -> None:
        pass

    def delete(self, keys: Sequence[str]) -> None:
        self.c.delete([k.encode() for k in keys])

    def close(self) -> None:
        self.c.close()


def _address(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class MooncakePeer:
    def __init__(self, master: str, metadata: str) -> None:
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        from mooncake.store import MooncakeDistributedStore

        self.s = MooncakeDistributedStore()
        rc = self.s.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master)
        if rc != 0:
            raise StoreError(f"MooncakeDistributedStore.setup returned {rc}")
        self.src = self.dst = 0
        self.size = 0

    def prepare(self, src: bytearray, dst: bytearray) -> None:
        self.src, self.dst, self.size = _address(src), _address(dst), len(src)
        for addr in (self.src, self.dst):
            rc = self.s.register_buffer(addr, self.size)
            if rc != 0:
                raise StoreError(f"register_buffer returned {rc}")

    def put(self, key: str, src: memoryview) -> None:
        rc = self.s.put_from(key, self.src, src.nbytes)
        if rc != 0:
            raise StoreError(f"put_from({key}) returned {rc}")

    def get_into(self, key: str, dst: memoryview) -> int:
        return int(self.s.get_into(key, self.dst, dst.nbytes))

    def finish_puts(self) -> None:
        pass

    def delete(self, keys: Sequence[str]) -> None:
        self.s.batch_remove(list(keys), True)

    def close(self) -> None:
        self.s.close()


class TcpPeer:
    """A peer on one loopback TCP connection with Nagle off."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()


class LMCacheServerPeer(TcpPeer):
    """No delete on its wire: every round uses new keys and the server keeps them all."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.reply = bytearray(REPLY.size)
        self.n = 0

    def _name(self, key: str) -> str:
        return f"kvdbench@1@0@{key.encode().hex()}@uint8"

    def _answer(self) -> tuple[int, int]:
        recv_into(self.sock, memoryview(self.reply))
        code, length = REPLY.unpack(self.reply)[:2]
        return int(code), int(length)

    def prepare(self, src: bytearray, dst: bytearray) -> None:
        pass

    def put(self, key: str, src: memoryview) -> None:
        self.sock.sendall(request(PUT, self._name(key), src.nbytes))
        self.sock.sendall(src)

    def finish_puts(self) -> None:
        self.sock.sendall(request(HEALTH, "kvdbench@1@0@0@uint8"))
        if self._answer()[0] != OK:
            raise StoreError("lmcache_server did not answer HEALTH")

    def get_into(self, key: str, dst: memoryview) -> int:
        self.sock.sendall(request(GET, self._name(key)))
        code, length = self._answer()
        if code != OK or length > dst.nbytes:
            return 0
        recv_into(self.sock, dst[:length])
        return length

    def exists(self, key: str) -> bool:
        self.sock.sendall(request(EXIST, self._name(key)))
        return self._answer()[0] == OK

    def delete(self, keys: Sequence[str]) -> None:
        pass


class RedisPeer(TcpPeer):
    """A minimal RESP client: a bulk reply is read straight into the caller's buffer."""

    def _cmd(self, *parts: bytes | memoryview) -> None:
        head = b"*%d\r\n" % len(parts)
        for p in parts[:-1]:
            head += b"$%d\r\n%s\r\n" % (len(p), bytes(p))
        last = parts[-1]
        n = last.nbytes if isinstance(last, memoryview) else len(last)
        self.sock.sendall(head + b"$%d\r\n" % n)
        self.sock.sendall(last)
        self.sock.sendall(b"\r\n")

    def _line(self) -> bytes:
        out = bytearray()
        while not out.endswith(b"\r\n"):
            ch = self.sock.recv(1)
            if not ch:
                raise ConnectionError("redis closed the connection")
            out += ch
        return bytes(out[:-2])

    def prepare(self, src: bytearray, dst: bytearray) -> None:
        pass

    def put(self, key: str, src: memoryview) -> None:
        self._cmd(b"SET", key.encode(), src)
        line = self._line()
        if line != b"+OK":
            raise StoreError(f"SET {key}: {line.decode(errors='replace')}")

    def finish_puts(self) -> None:
        pass

    def get_into(self, key: str, dst: memoryview) -> int:
        self._cmd(b"GET", key.encode())
        line = self._line()
        if not line.startswith(b"$") or line == b"$-1":
            return 0
        length = int(line[1:])
        if length > dst.nbytes:
            raise StoreError(f"GET {key}: {length} bytes do not fit")
        recv_into(self.sock, dst[:length])
        recv_into(self.sock, memoryview(bytearray(2)))
        return length

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            self._cmd(b"DEL", *[k.encode() for k in keys])
            self._line()


def memcpy_gbps(size: int, count: int, rounds: int) -> dict[str, float]:
    """One copy per chunk, the way a store's data moves: a put copies one source buffer into
    ``count`` distinct chunks of a region, a get copies each chunk out into one buffer. Best of
    ``rounds`` after a warm-up pass that faults the region in: the limit."""
    src, dst = bytearray(os.urandom(size)), bytearray(size)
    region = bytearray(size * count)
    s, d, r = memoryview(src), memoryview(dst), memoryview(region)
    slots = [r[i * size : (i + 1) * size] for i in range(count)]
    put_s: list[float] = []
    get_s: list[float] = []
    for _ in range(rounds + 1):
        t = time.perf_counter()
        for slot in slots:
            slot[:] = s
        put_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        for slot in slots:
            d[:] = slot
        get_s.append(time.perf_counter() - t)
    total = size * count
    return {"put_gbps": total / min(put_s[1:]) / 1e9, "get_gbps": total / min(get_s[1:]) / 1e9}


def measure(peer: Peer, size: int, count: int, rounds: int) -> dict[str, Any]:
    src, dst = bytearray(os.urandom(size)), bytearray(size)
    peer.prepare(src, dst)
    sv, dv = memoryview(src), memoryview(dst)
    put_s: list[float] = []
    get_s: list[float] = []
    for r in range(rounds + 1):  # round 0 is the untimed warm-up
        keys = [f"cmp-{os.getpid()}-{r}-{i}" for i in range(count)]
        t = time.perf_counter()
        for k in keys:
            peer.put(k, sv)
        peer.finish_puts()
        t_put = time.perf_counter() - t
        dst[:8] = b"\0" * 8
        t = time.perf_counter()
        for k in keys:
            n = peer.get_into(k, dv)
            if n != size:
                raise StoreError(f"read back {n} bytes of {k}, expected {size}")
        t_get = time.perf_counter() - t
        if dst != src:
            raise StoreError("read back different bytes")
        peer.delete(keys)
        if r:
            put_s.append(t_put)
            get_s.append(t_get)
    total = size * count
    return {
        "put_gbps": total / min(put_s) / 1e9,
        "get_gbps": total / min(get_s) / 1e9,
        "put_ms": min(put_s) / count * 1e3,
        "get_ms": min(get_s) / count * 1e3,
    }


def make_peer(name: str, args: dict[str, Any]) -> Peer:
    if name == "kvd":
        return KvdPeer(args["socket"])
    if name == "mooncake":
        return MooncakePeer(args["master"], args["metadata"])
    if name == "lmcache_server":
        return LMCacheServerPeer(int(args["port"]))
    if name == "redis":
        return RedisPeer(int(args["port"]))
    raise ValueError(f"unknown peer {name!r}")


def main() -> None:
    name, args = sys.argv[1], json.loads(sys.argv[2])
    peer = make_peer(name, args)
    try:
        res = measure(peer, int(args["size"]), int(args["count"]), int(args["rounds"]))
    finally:
        peer.close()
    print("RESULT " + json.dumps(res), flush=True)
    os._exit(0)  # Mooncake's client threads can hold up a normal exit


if __name__ == "__main__":
    main()
