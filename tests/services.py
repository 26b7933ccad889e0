"""Real external services on loopback for tests: Mooncake master and storage node, lmcache_server,
etcd and Redis.

The services themselves live in :mod:`infera.bench.services` (the benchmarks start them too);
here a missing program becomes a skip, and the fixtures start and stop them. A test is skipped
only when the program itself is not installed; every other failure is an error that shows the
service's log.

Use the fixtures from a ``conftest.py``: ``from services import *  # noqa: F403``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from infera.bench import services as bench_services
from infera.bench.services import *  # noqa: F403  (re-exported: the tests name the services from here)
from infera.bench.services import (
    Etcd,
    LMCacheServer,
    MooncakeMaster,
    MooncakeStorageNode,
    Redis,
    Service,
    set_missing_handler,
)


def _skip(message: str) -> NoReturn:
    pytest.skip(message)


set_missing_handler(_skip)


@pytest.fixture
def service_dir(short_tmp: Path) -> Path:
    """Where the services of a test keep their logs and data: a folder of its short temporary
    directory (:func:`conftest.short_tmp`)."""
    d = short_tmp / "services"
    d.mkdir()
    return d


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


S = TypeVar("S", bound=Service)


def _started(kind: type[S], name: str) -> Any:
    """The fixture ``name``: a started ``kind(service_dir)``, stopped at teardown."""

    def fixture(services: Callable[[Service], Service], service_dir: Path) -> S:
        svc = services(kind(service_dir))
        assert isinstance(svc, kind)
        return svc

    fixture.__doc__ = f"A running {kind.__name__} (``{kind.__module__}``), stopped at teardown."
    return pytest.fixture(name=name)(fixture)


mooncake_master = _started(MooncakeMaster, "mooncake_master")
lmcache_server = _started(LMCacheServer, "lmcache_server")
etcd = _started(Etcd, "etcd")
redis = _started(Redis, "redis")


@pytest.fixture
def mooncake_node(
    services: Callable[[Service], Service], service_dir: Path, mooncake_master: MooncakeMaster
) -> MooncakeStorageNode:
    svc = services(MooncakeStorageNode(service_dir, mooncake_master))
    assert isinstance(svc, MooncakeStorageNode)
    return svc


# the services' names as infera.bench.services exports them, and the fixtures
__all__ = [
    *(name for name in bench_services.__all__ if name not in ("ServiceMissing", "set_missing_handler")),
    "etcd",
    "lmcache_server",
    "mooncake_master",
    "mooncake_node",
    "redis",
    "service_dir",
    "services",
]
