"""Chunk files through cuFile/hipFile: written from and read into GPU memory, checksummed on the GPU (``wsum31``)."""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Any

from infera.engine.vllm.worker.gpu.gpudirect import FileApi, GpuDirectError
from infera.kvd import chunkfile as cf


# -- GPU checksum -------------------------------------------------------------------------------
def gpu_wsum31(t: Any, rows_per_slab: int = 64) -> int:
    """``chunkfile.wsum31`` of a uint8 tensor on any device, computed there with torch ops.

    Works on slabs of 64 rows of 2^17 words (16 MiB of payload), so the int64 temporaries stay
    bounded whatever the chunk size; one host sync at the end."""
    import torch

    if t.numel() % 2:
        t = torch.cat([t, t.new_zeros(1)])
    piece = cf.WSUM_PIECE
    p = cf.WSUM_MOD
    dev = t.device
    w0 = torch.arange(1, piece + 1, dtype=torch.int64, device=dev)
    words16 = t.view(torch.int16)
    m = words16.numel()
    s1 = torch.zeros((), dtype=torch.int64, device=dev)
    s2 = torch.zeros((), dtype=torch.int64, device=dev)
    slab = rows_per_slab * piece
    for lo in range(0, m, slab):
        words = (words16[lo : lo + slab].to(torch.int32) & 0xFFFF).to(torch.int64)
        k = words.numel()
        rows = -(-k // piece)
        if rows * piece != k:
            words = torch.cat([words, words.new_zeros(rows * piece - k)])
        words = words.view(rows, piece)
        sums = words.sum(dim=1)  # < 2^33 each
        dots = (words * w0).sum(dim=1)  # products < 2^46, 2^17 of them: < 2^63
        starts = (torch.arange(rows, dtype=torch.int64, device=dev) * piece + lo) % p
        s1 = (s1 + sums.sum()) % p
        s2 = (s2 + (((sums % p) * starts) % p + dots % p).sum()) % p
    return cf.wsum_combine(int(s1.item()), int(s2.item()))


# -- file I/O ---------------------------------------------------------------------------------
_tls = threading.local()


def _aligned_header() -> memoryview:
    """A page-aligned 4 KiB buffer per thread (O_DIRECT needs aligned memory)."""
    buf = getattr(_tls, "header", None)
    if buf is None:
        buf = _tls.header = memoryview(mmap.mmap(-1, cf.HEADER_SIZE))
    return buf


class ChunkFiles:
    """Chunk files under ``root`` written from and read into device memory through ``api``."""

    def __init__(self, api: FileApi, root: str, namespace: str, *, direct: bool = True) -> None:
        self.api = api
        self.root = root
        self.namespace = namespace
        self.digest = cf.ns_digest(namespace)
        self.direct = direct
        self.counters: dict[str, int] = {}

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _close(self, handle: int, fd: int) -> None:
        """Deregister ``handle`` (0: none) from the cuFile/hipFile driver, then close ``fd``."""
        if handle:
            self.api.deregister(handle)
        os.close(fd)

    def _count_done(self, op: str, length: int, started: float) -> None:
        """One chunk of ``length`` bytes read or written (``op``) since ``perf_counter()`` was ``started``."""
        self._count(f"gd_{op}_chunks")
        self._count(f"gd_{op}_bytes", length)
        self._count(f"gd_{op}_us", int((time.perf_counter() - started) * 1e6))

    def path(self, key: bytes) -> str:
        return os.path.join(self.root, cf.relpath(self.digest, key))

    def _open(self, path: str, flags: int) -> int:
        if self.direct:
            try:
                return os.open(path, flags | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != 22:  # EINVAL: this filesystem refuses O_DIRECT
                    raise
                self._count("gd_no_odirect")
        return os.open(path, flags)

    def write(self, key: bytes, payload: Any, *, checksum: int | None = None, sync: bool = True) -> str:
        """Write ``payload`` (a uint8 device tensor) as the chunk file of ``key``; returns its
        path. The header goes through the page cache, the payload from device memory."""
        started = time.perf_counter()
        length = payload.numel()
        csum = gpu_wsum31(payload) if checksum is None else checksum
        header = cf.ChunkHeader(
            key=key,
            namespace_digest=self.digest,
            payload_length=length,
            payload_checksum=csum,
            algo=cf.ALGO_WSUM31,
            created_ns=time.time_ns(),
            namespace=self.namespace,
        ).pack()
        cf.ensure_dir(self.root, self.digest, key, self.namespace)
        final = self.path(key)
        d, base = os.path.split(final)
        tmp = os.path.join(d, f".{base}.{os.getpid()}.gd{cf.TMP_SUFFIX}")
        fd = self._open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)  # cuFile wants O_RDWR
        handle = 0
        try:
            hb = _aligned_header()
            hb[:] = header
            if os.pwrite(fd, hb, 0) != cf.HEADER_SIZE:
                raise OSError(5, "short header write")
            handle = self.api.register_fd(fd)
            n = self.api.write(handle, payload.data_ptr(), length, cf.HEADER_SIZE, 0)
            if n != length:
                raise GpuDirectError(f"{self.api.flavor.prefix}Write wrote {n} of {length} bytes")
            if sync:
                os.fdatasync(fd)
        except BaseException:
            self._close(handle, fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self._count("gd_write_errors")
            raise
        self._close(handle, fd)
        os.rename(tmp, final)
        self._count_done("write", length, started)
        return final

    def read(self, key: bytes, out: Any) -> cf.ChunkHeader:
        """Read the chunk of ``key`` into ``out`` (a uint8 device tensor of the payload's size)
        and verify it before anyone uses it. Raises FileNotFoundError, ChunkFileError or
        GpuDirectError."""
        started = time.perf_counter()
        path = self.path(key)
        fd = self._open(path, os.O_RDONLY | os.O_CLOEXEC)
        handle = 0
        try:
            size = os.fstat(fd).st_size
            hb = _aligned_header()
            if os.preadv(fd, [hb], 0) != cf.HEADER_SIZE:
                raise cf.CorruptChunk("truncated header")
            header = cf.ChunkHeader.unpack(hb)
            want = out.numel()
            if header.payload_length != want or size != cf.HEADER_SIZE + want:
                raise cf.CorruptChunk(f"file holds {size - cf.HEADER_SIZE} payload bytes, expected {want}")
            if header.key != key or header.namespace_digest != self.digest:
                raise cf.CorruptChunk("file holds another key or namespace than its name says")
            handle = self.api.register_fd(fd)
            n = self.api.read(handle, out.data_ptr(), want, cf.HEADER_SIZE, 0)
            if n != want:
                raise GpuDirectError(f"{self.api.flavor.prefix}Read read {n} of {want} bytes")
        finally:
            self._close(handle, fd)
        self._verify(header, out)
        self._count_done("read", want, started)
        return header

    def _verify(self, header: cf.ChunkHeader, out: Any) -> None:
        if header.algo == cf.ALGO_WSUM31:
            got = gpu_wsum31(out)
        else:  # a daemon-written file (xxh3 or crc32): verify on the host
            self._count("gd_verify_on_host")
            got = cf.checksum(header.algo, out.cpu().numpy().tobytes())
        if got != header.payload_checksum:
            self._count("gd_corrupt")
            raise cf.CorruptChunk(
                f"payload checksum mismatch ({cf.ALGO_NAMES.get(header.algo, header.algo)})"
            )
