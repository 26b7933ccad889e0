"""Fixture host trees and faked commands for doctor tests (used through the ``hosts`` fixture).

A host fixture is ``tests/fixtures/hosts/<name>/``: ``tree/`` holds the host's files (read through
``--root``), ``commands.yaml`` lists the command lines the doctor may run there and what each
prints. Commands not listed are "not installed": the runner's PATH is a directory of stubs for
the listed ones only, and pytest-subprocess answers for them. Git cannot hold socket files, so an
optional ``sockets.yaml`` lists host paths where a socket file is created (bound, then closed) in
a copy of the tree before the doctor runs on it.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from infera.doctor.context import Context, DoctorOptions
from infera.doctor.host import HostView
from infera.doctor.run import Report, run_doctor
from infera.doctor.runner import CommandRunner

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hosts"
HOSTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "tree").is_dir())


class FixtureHost:
    """Builds a doctor Context over one fixture host (optionally a modified copy of it)."""

    def __init__(self, fp: Any, tmp_path: Path) -> None:
        self.fp = fp
        self.tmp = tmp_path

    def copy(self, name: str) -> Path:
        """A writable copy of a fixture tree, for variants made inside one test."""
        dst = self.tmp / "trees" / name
        n = 1
        while dst.exists():
            n += 1
            dst = self.tmp / "trees" / f"{name}-{n}"
        shutil.copytree(FIXTURES / name / "tree", dst, symlinks=True)
        return dst

    def with_sockets(self, name: str, tree: Path | None) -> Path | None:
        """``tree`` (or a copy of the fixture's) with the sockets of ``sockets.yaml`` created in it."""
        spec = FIXTURES / name / "sockets.yaml"
        if not spec.exists():
            return tree
        root = tree or self.copy(name)
        for host_path in yaml.safe_load(spec.read_text()) or []:
            real = root / str(host_path).lstrip("/")
            if real.is_socket():
                continue
            real.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:  # through /proc/self/fd: a long tmp path would not fit in sun_path
                s.bind(f"/proc/self/fd/{fd}/{real.name}")
            finally:
                s.close()
                os.close(fd)
        return root

    def context(
        self,
        name: str,
        *,
        tree: Path | None = None,
        environ: dict[str, str] | None = None,
        processes: Callable[[], Iterable[Any]] | None = None,
        commands: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> Context:
        src = FIXTURES / name
        root = (self.with_sockets(name, tree) or src / "tree").resolve()
        specs = (
            commands if commands is not None else yaml.safe_load((src / "commands.yaml").read_text()) or []
        )
        bindir = self.tmp / f"bin-{name}-{len(list(self.tmp.glob('bin-*')))}"
        bindir.mkdir(parents=True)
        for spec in specs:
            argv = [str(a).replace("{root}", str(root)) for a in spec["argv"]]
            stub = bindir / argv[0]
            stub.write_text("#!/bin/sh\nexit 99\n")
            stub.chmod(0o755)
            stdout = spec.get("stdout", "")
            if "stdout_file" in spec:
                stdout = (src / spec["stdout_file"]).read_text()
            self.fp.register(
                [self.fp.program(argv[0]), *argv[1:]],
                stdout=stdout,
                stderr=spec.get("stderr", ""),
                returncode=spec.get("returncode", 0),
                occurrences=20,
            )
        opts = DoctorOptions(root=str(root), **options)
        host = HostView(root)
        return Context(
            opts,
            host=host,
            runner=CommandRunner(host, path=str(bindir), env={"PATH": str(bindir)}),
            environ=environ or {},
            processes=processes or (lambda: []),
        )

    def run(self, name: str, **kw: Any) -> Report:
        return run_doctor(ctx=self.context(name, **kw))


def statuses(report: Report) -> dict[str, str]:
    return {r.id: str(r.result.status) for r in report.results}
