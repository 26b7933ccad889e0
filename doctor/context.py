"""What a check may look at: the host view, the command runner, processes, options, the daemon.

:class:`DoctorOptions` holds the command-line options; a new option (``--etcd HOST:PORT``) is one
field here and one ``typer.Option`` in :mod:`infera.doctor.cli`. Facts several checks share
(container signals, the GPU list, ``dmesg``) are computed once through :meth:`Context.memo`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from infera.doctor.host import HostView
from infera.doctor.runner import CommandRunner

if TYPE_CHECKING:
    import psutil

T = TypeVar("T")


@dataclass
class DoctorOptions:
    """Command-line options. ``socket_explicit`` tells "the user asked for this daemon" apart from a default."""

    root: str = "/"
    socket: str | None = None
    socket_explicit: bool = False
    long_path: str | None = None
    etcd: str | None = None
    etcd_prefix: str | None = None
    checks: list[str] = field(default_factory=list)
    verbose: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    #: daemon flags given to kvd doctor (by dest, as typed): they override the running daemon's
    daemon_flags: dict[str, Any] = field(default_factory=dict)
    #: ``--probe-isolation`` and the engine it sends requests to (``--engine URL``)
    probe_isolation: bool = False
    engine: str | None = None


def live_processes() -> Iterable[psutil.Process]:
    import psutil

    return psutil.process_iter()


class Context:
    """Everything a check reads, behind seams tests can point at fixtures.

    ``environ`` is the environment of the machine being checked (this process's on a live root,
    empty for a fixture tree unless a test gives one); ``processes`` lists the processes to scan
    (all of this machine's on a live root, none otherwise, a test's own children in tests).
    """

    def __init__(
        self,
        options: DoctorOptions | None = None,
        *,
        host: HostView | None = None,
        runner: CommandRunner | None = None,
        environ: Mapping[str, str] | None = None,
        processes: Callable[[], Iterable[psutil.Process]] | None = None,
    ) -> None:
        self.options = options or DoctorOptions()
        self.host = host or HostView(self.options.root)
        self.runner = runner or CommandRunner(self.host)
        if environ is None:
            environ = dict(os.environ) if self.host.live else {}
        self.environ: Mapping[str, str] = environ
        if processes is None:
            processes = live_processes if self.host.live else (lambda: [])
        self.processes = processes
        self._memo: dict[str, Any] = {}

    @property
    def live(self) -> bool:
        return self.host.live

    def memo(self, key: str, fn: Callable[[Context], T]) -> T:
        """``fn(self)`` computed once per doctor run (facts shared by several checks)."""
        if key not in self._memo:
            self._memo[key] = fn(self)
        return self._memo[key]  # type: ignore[no-any-return]
