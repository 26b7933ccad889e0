"""A stand-in for libcufile / libhipfile: the same C functions, done with POSIX I/O on host memory.

The binding (``infera.engine.vllm.worker.gpu.gpudirect.FileApi``) sets ``restype``/``argtypes`` on each
function and calls it with ctypes arguments; these Python functions accept exactly that, record
every call, and move bytes between the registered file descriptor and the "device" pointer (a
CPU tensor's address here). O_DIRECT descriptors need aligned buffers, so reads and writes go
through an mmap-backed bounce buffer, as cuFile's compat mode does.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

from infera.engine.vllm.worker.gpu.gpudirect import _Err


def _aligned(n: int) -> mmap.mmap:
    return mmap.mmap(-1, max(4096, -(-n // 4096) * 4096))


class FakeFileLib:
    def __init__(self, prefix: str = "cuFile", open_error: int = 0, register_error: int = 0) -> None:
        self.prefix = prefix
        self.calls: list[tuple[Any, ...]] = []
        self.handles: dict[int, int] = {}
        self.open_error = open_error
        self.register_error = register_error
        self._next = 1000
        lib = self

        def driver_open() -> _Err:
            lib.calls.append(("DriverOpen",))
            return _Err(lib.open_error, 0)

        def driver_close() -> _Err:
            lib.calls.append(("DriverClose",))
            return _Err(0, 0)

        def handle_register(handle_ref: Any, descr_ref: Any) -> _Err:
            descr = descr_ref._obj
            lib.calls.append(("HandleRegister", descr.type, descr.handle.fd))
            if lib.register_error:
                return _Err(lib.register_error, 0)
            lib._next += 1
            lib.handles[lib._next] = descr.handle.fd
            handle_ref._obj.value = lib._next
            return _Err(0, 0)

        def handle_deregister(handle: int) -> None:
            lib.calls.append(("HandleDeregister", handle))
            lib.handles.pop(handle)

        def read(handle: int, ptr: int, size: int, file_off: int, buf_off: int) -> int:
            lib.calls.append(("Read", handle, size, file_off, buf_off))
            buf = _aligned(size)
            n = os.preadv(lib.handles[handle], [buf], file_off)
            n = min(n, size)
            ctypes.memmove(ptr + buf_off, ctypes.addressof(ctypes.c_char.from_buffer(buf)), n)
            return n

        def write(handle: int, ptr: int, size: int, file_off: int, buf_off: int) -> int:
            lib.calls.append(("Write", handle, size, file_off, buf_off))
            buf = _aligned(size)
            ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(buf)), ptr + buf_off, size)
            view = memoryview(buf)[: -(-size // 4096) * 4096]
            n = os.pwritev(lib.handles[handle], [view], file_off)
            if n > size:
                os.ftruncate(lib.handles[handle], file_off + size)
            return min(n, size)

        for name, fn in (
            ("DriverOpen", driver_open),
            ("DriverClose_v2", driver_close),
            ("HandleRegister", handle_register),
            ("HandleDeregister", handle_deregister),
            ("Read", read),
            ("Write", write),
        ):
            setattr(self, prefix + name, fn)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]
