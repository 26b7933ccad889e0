"""Real external services on loopback for tests: Mooncake master and storage node, lmcache_server,
etcd and Redis.

The services themselves live in :mod:`infera.bench.services` (the benchmarks start them too);
here a missing program becomes a skip, and the fixtures start and stop them. A test is skipped
only when the program itself is not installed; every other failure is an error that shows the
service's log.

Use the fixtures from a ``conftest.py``: ``from services import *  # noqa: F403``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from infera.bench.services import (
    REPO,
    Etcd,
    LMCacheServer,
    MooncakeMaster,
    MooncakeStorageNode,
    Redis,
    Service,
    find_program,
    free_port,
    require,
    set_missing_handler,
    tcp_open,
)


def _skip(message: str) -> NoReturn:
    pytest.skip(message)


set_missing_handler(_skip)


@pytest.fixture
def service_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvd-svc-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def services(service_dir: Path) -> Iterator[Callable[[Service], Service]]:
    """``services(MooncakeMaster(service_dir))``: start a service, stopped at teardown."""
    started: list[Service] = []

    def _start(svc: Service) -> Service:
        started.append(svc)
        return svc.start()

    yield _start
    for svc in reversed(started):
        svc.stop()


@pytest.fixture
def mooncake_master(services: Callable[[Service], Service], service_dir: Path) -> MooncakeMaster:
    svc = services(MooncakeMaster(service_dir))
    assert isinstance(svc, MooncakeMaster)
    return svc


@pytest.fixture
def mooncake_node(
    services: Callable[[Service], Service], service_dir: Path, mooncake_master: MooncakeMaster
) -> MooncakeStorageNode:
    svc = services(MooncakeStorageNode(service_dir, mooncake_master))
    assert isinstance(svc, MooncakeStorageNode)
    return svc


@pytest.fixture
def lmcache_server(services: Callable[[Service], Service], service_dir: Path) -> LMCacheServer:
    svc = services(LMCacheServer(service_dir))
    assert isinstance(svc, LMCacheServer)
    return svc


@pytest.fixture
def etcd(services: Callable[[Service], Service], service_dir: Path) -> Etcd:
    svc = services(Etcd(service_dir))
    assert isinstance(svc, Etcd)
    return svc


@pytest.fixture
def redis(services: Callable[[Service], Service], service_dir: Path) -> Redis:
    svc = services(Redis(service_dir))
    assert isinstance(svc, Redis)
    return svc


__all__ = [
    "REPO",
    "Etcd",
    "LMCacheServer",
    "MooncakeMaster",
    "MooncakeStorageNode",
    "Redis",
    "Service",
    "etcd",
    "find_program",
    "free_port",
    "lmcache_server",
    "mooncake_master",
    "mooncake_node",
    "redis",
    "require",
    "service_dir",
    "services",
    "tcp_open",
]
