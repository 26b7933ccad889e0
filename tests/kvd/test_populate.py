"""A client populates each region it is handed in its own mapping of the arena before the copy
(:mod:`infera.kvd.populate`): without it, a region another process wrote costs this client a page
fault per 4 KiB page on first touch, which held several streaming clients near 8 GB/s in all.

What is checked is the page tables, not a time: the resident size of the client's own mapping
(``/proc/self/smaps``) right after ``lease``/``reserve`` returned, before any byte was copied."""

from __future__ import annotations

import ctypes
import mmap
import os

from infera.kvd.client import KvdClient
from infera.kvd.populate import GRAIN, Populated
from infera.kvd.process import DaemonProcess

MIB = 1 << 20


def mapped_kib(client: KvdClient) -> int:
    """Resident KiB of this client's own mapping of the arena (other mappings of it not counted)."""
    assert client._map is not None
    obj = ctypes.c_char.from_buffer(client._map)
    start = ctypes.addressof(obj)
    del obj  # the export would keep the mapping from closing
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == start
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("the client's arena mapping is not in /proc/self/smaps")


def test_leased_and_reserved_regions_are_in_the_clients_mapping_before_the_copy(
    daemon: DaemonProcess,
) -> None:
    data = os.urandom(4 * MIB)
    with daemon.client(namespace="p") as writer, daemon.client(namespace="p") as reader:
        assert writer.put(b"big", data)
        assert mapped_kib(reader) == 0  # a fresh mapping: nothing of the arena in its page tables
        ((lease, off, length),) = reader.lease([b"big"])  # type: ignore[misc]
        assert length == len(data) and mapped_kib(reader) >= 4 * 1024
        assert bytes(reader.arena[off : off + length]) == data  # populating changed no byte
        reader.release([lease])
        before = mapped_kib(reader)
        (slot,) = reader.reserve([b"big2"], [4 * MIB])
        assert isinstance(slot, tuple)
        token, off2 = slot
        assert mapped_kib(reader) >= before + 4 * 1024 - GRAIN // 1024
        reader.arena[off2 : off2 + 4 * MIB] = data
        reader.seal([token])
        assert writer.get(b"big2") == data and reader.get(b"big") == data


def test_small_chunks_are_left_to_fault_and_prefault_maps_the_whole_arena(daemon: DaemonProcess) -> None:
    with daemon.client(namespace="p") as c:
        assert c.put(b"small", b"s" * 4096)
        assert mapped_kib(c) == 4  # the one page the put wrote
        c.lease([b"small"])
        assert mapped_kib(c) == 4  # smaller than a grain: nothing populated, not worth a system call
        c.prefault()
        assert mapped_kib(c) == c.arena_size // 1024
        assert c.get(b"small") == b"s" * 4096


def test_a_region_is_populated_once_and_a_refusal_turns_populating_off() -> None:
    fd = os.memfd_create("populate-test")
    try:
        os.ftruncate(fd, 8 * GRAIN)
        region = mmap.mmap(fd, 8 * GRAIN)
        p = Populated(region, 8 * GRAIN)
        p.ensure(GRAIN // 2, 2 * GRAIN)  # the one grain wholly inside is remembered
        assert bytes(p._done[:4]) == b"\0\1\0\0"
        for bad in (-1, "0", None):  # not an offset (a daemon that misbehaves): nothing happens
            p.ensure(bad, GRAIN)
        p.ensure(4 * GRAIN, 1 << 62)  # past the mapping: nothing populated, nothing remembered
        assert p.enabled and len(p._done) == 9 and bytes(p._done[4:]) == b"\0" * 5
        region.close()
        p.ensure(4 * GRAIN, 2 * GRAIN)  # the kernel (here: the closed mapping) refuses
        assert not p.enabled
    finally:
        os.close(fd)


def test_client_without_arena_has_nothing_to_populate(daemon: DaemonProcess) -> None:
    with KvdClient(daemon.socket, namespace="p", want_arena=False) as c:
        c.prefault()
        assert c.ping()


def test_a_mapping_whose_pages_are_present_is_not_populated_again(daemon: DaemonProcess) -> None:
    """A GPU worker's mapping is pinned by ``cudaHostRegister`` (every page mapped): after
    ``pages_present`` a LEASE no longer walks the region again, and the bytes are the same."""
    data = os.urandom(4 * MIB)
    with daemon.client(namespace="p") as writer, daemon.client(namespace="p") as reader:
        assert writer.put(b"big", data)
        reader.pages_present()
        ((lease, off, length),) = reader.lease([b"big"])  # type: ignore[misc]
        assert mapped_kib(reader) == 0, "the region was populated although the pages are present"
        assert bytes(reader.arena[off : off + length]) == data
        reader.release([lease])
