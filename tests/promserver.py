"""A real Prometheus server for the tests (Debian's ``prometheus`` package), on loopback only.

``PromServer({"kvd": ["127.0.0.1:9464"]}, workdir).start()`` writes a config scraping each job
every second, starts ``/usr/bin/prometheus`` on a free 127.0.0.1 port with its TSDB under
``workdir``, and waits until it is ready. :meth:`query` runs an instant query through the HTTP API;
:meth:`wait_for` polls one until a predicate holds. ``promtool`` finds promtool for the checks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from helpers import free_port
from infera.kvd.exposition import TIER_FIELDS, TIER_SKIPPED

SCRAPE_S = 1


def binary(name: str) -> str | None:
    return shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)


class PromServer:
    def __init__(
        self,
        jobs: dict[str, Sequence[str]],
        workdir: Path,
        *,
        rule_files: Sequence[str | Path] = (),
    ) -> None:
        self.jobs = jobs
        self.workdir = Path(workdir)
        self.rule_files = [str(p) for p in rule_files]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        return {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": self.rule_files,
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in self.jobs.items()
            ],
        }

    def start(self, timeout: float = 30) -> PromServer:
        exe = binary("prometheus")
        if exe is None:
            raise AssertionError("prometheus is not installed (scripts/setup.sh --all installs it)")
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config()))
        tsdb = self.workdir / "tsdb"
        tsdb.mkdir(exist_ok=True)
        cmd = [
            exe,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready after {timeout:g} s:\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: ``[{"metric": {labels}, "value": float}, ...]``."""
        data = self.api("query", query=expr)
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def value(self, expr: str) -> float | None:
        """The one value of a query that should give at most one series (None: no series)."""
        rows = self.query(expr)
        assert len(rows) <= 1, rows
        return rows[0]["value"] if rows else None

    def wait_for(
        self, expr: str, pred: Callable[[float | None], bool], what: str, timeout: float = 20
    ) -> float | None:
        deadline = time.monotonic() + timeout
        last: float | None = None
        while True:
            last = self.value(expr)
            if pred(last):
                return last
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {expr} = {last}")
            time.sleep(0.25)

    def targets_up(self) -> dict[str, float]:
        return {r["metric"]["job"]: r["value"] for r in self.query("up")}

    def series_names(self) -> set[str]:
        return set(self.api("label/__name__/values"))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = binary("promtool")
    if exe is None:
        raise AssertionError("promtool is not installed (scripts/setup.sh --all installs prometheus)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def assert_tier_fields_declared(tiers: dict[str, dict[str, Any]]) -> None:
    """Every numeric field the tiers report (STATS ``tiers``) has a declared exposed name, type and
    help, so a new field cannot slip out as a made-up counter. tests/obs and tests/l4 call it."""
    for tier, fields in tiers.items():
        for fname, value in fields.items():
            if isinstance(value, int | float) and fname not in TIER_SKIPPED:
                assert fname in TIER_FIELDS, f"tiers.{tier}.{fname} is not declared in exposition.TIER_FIELDS"
