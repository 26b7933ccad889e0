"""The isolation probe's logic against a fake vLLM server (an HTTP server in a thread): an honest
engine passes, one whose keys drop cache_salt fails loudly, and a probe that cannot see hits says so.
The real engines are in tests/vllm/test_isolation_probe.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from typer.testing import CliRunner

from infera.cli import app
from infera.doctor.context import Context, DoctorOptions
from infera.doctor.probe import Engine, Probe
from infera.doctor.run import run_doctor

CHUNK = 256


class FakeVllm:
    """vLLM's prefix cache (keyed by salt and tokens) in front of an external cache whose keys may
    drop the salt (``honest=False``), with vLLM's counters and kvd's."""

    def __init__(
        self, honest: bool = True, dev_mode: bool = True, connector: bool = True, details: bool = False
    ):
        self.honest, self.dev_mode, self.connector, self.details = honest, dev_mode, connector, details
        self.local: set[tuple[Any, ...]] = set()
        self.external: set[tuple[Any, ...]] = set()
        self.c = {"ext_hits": 0, "ext_queries": 0, "local_hits": 0}
        self.daemon = {
            "sets_total": 0,
            "hits_total": 0,
            "clients": [{"role": "vllm-scheduler", "chunk_tokens": CHUNK}],
        }

    def complete(self, ids: list[int], salt: str | None) -> dict[str, Any]:
        n = len(ids)
        chunks = (n - 1) // CHUNK
        local_key, ext_key = (salt, tuple(ids)), ((salt if self.honest else None), tuple(ids))
        cached = 0
        self.c["ext_queries"] += n
        if local_key in self.local:
            cached = chunks * CHUNK
            self.c["local_hits"] += cached
        elif ext_key in self.external:
            cached = chunks * CHUNK
            self.c["ext_hits"] += cached
            self.daemon["hits_total"] += chunks
        else:
            self.external.add(ext_key)
            self.daemon["sets_total"] += chunks
        self.local.add(local_key)
        usage: dict[str, Any] = {"prompt_tokens": n}
        if self.details:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return {"choices": [{"text": "x"}], "usage": usage}

    def metrics(self) -> str:
        labels = '{engine="0",model_name="fake"}'
        lines = [f"vllm:prefix_cache_hits_total{labels} {self.c['local_hits']}"]
        if self.connector:
            lines += [
                f"vllm:external_prefix_cache_hits_total{labels} {self.c['ext_hits']}",
                f"vllm:external_prefix_cache_queries_total{labels} {self.c['ext_queries']}",
            ]
        return "# HELP x\n" + "\n".join(lines) + "\n"


@pytest.fixture
def fake() -> Iterator[Any]:
    servers = []

    def start(**kw: Any) -> tuple[FakeVllm, str]:
        model = FakeVllm(**kw)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "fake", "max_model_len": 4096}]}))
                elif self.path == "/metrics":
                    self._send(200, model.metrics(), "text/plain")
                else:
                    self._send(404, "{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/v1/completions":
                    self._send(200, json.dumps(model.complete(body["prompt"], body.get("cache_salt"))))
                elif self.path == "/reset_prefix_cache" and model.dev_mode:
                    model.local.clear()
                    self._send(200, "")
                else:
                    self._send(404, '{"detail": "Not Found"}')

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return model, f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _probe(model: FakeVllm, url: str, daemon: bool = True) -> Any:
    return Probe(
        Engine(url + "/v1"), (lambda: dict(model.daemon)) if daemon else (lambda: None), settle_s=0.5
    ).run()


def test_an_honest_engine_passes_with_the_control(fake: Any) -> None:
    model, url = fake()
    r = _probe(model, url)
    assert r.status.value == "ok", r.summary
    assert "another salt and no salt got 0 external hits" in r.summary and "hit 512 tokens" in r.summary
    steps = [e.value for e in r.evidence if e.kind == "probe"][1:]
    expected = [
        "tenant A (",
        "tenant B, same prompt (",
        "no salt, same prompt (",
        "tenant A again, after a prefix-cache reset",
    ]
    assert len(steps) == len(expected) and all(v.startswith(x) for v, x in zip(steps, expected, strict=True))


def test_an_engine_that_drops_cache_salt_fails_loudly(fake: Any) -> None:
    model, url = fake(honest=False)
    r = _probe(model, url)
    assert r.status.value == "fail"
    assert r.summary.startswith("CROSS-TENANT HIT") and "512 prompt tokens" in r.summary
    assert "the daemon served 2 chunks" in r.summary
    assert "drops cache_salt" in (r.fix or "")


def test_per_request_numbers_are_used_when_the_server_gives_them(fake: Any) -> None:
    model, url = fake(honest=False, details=True)
    r = _probe(model, url)
    assert r.status.value == "fail"
    assert any("cached_tokens 512" in e.value for e in r.evidence)
    assert not any("per-request numbers" in d for d in r.details)


def test_without_reset_the_daemon_counters_stand_in_for_the_control(fake: Any) -> None:
    model, url = fake(dev_mode=False)
    r = _probe(model, url)
    assert (
        r.status.value == "ok"
        and "control was skipped" in r.summary
        and "VLLM_SERVER_DEV_MODE=1" in r.summary
    )
    blind = _probe(*fake(dev_mode=False), daemon=False)
    assert blind.status.value == "warn" and "nothing shows the probe could have seen one" in blind.summary


def test_a_control_without_a_hit_makes_the_pass_worthless(fake: Any) -> None:
    model, url = fake()
    model.external = _Forgetful()  # stores nothing: no hit, ever
    r = _probe(model, url)
    assert r.status.value == "warn" and "proves nothing" in r.summary


class _Forgetful(set):  # type: ignore[type-arg]
    def add(self, item: Any) -> None:
        return None


def test_an_engine_without_a_connector_or_unreachable_is_unknown(fake: Any) -> None:
    model, url = fake(connector=False)
    r = _probe(model, url)
    assert r.status.value == "unknown" and "no vllm:external_prefix_cache_queries" in r.summary
    gone = Probe(Engine("http://127.0.0.1:1"), lambda: None).run()
    assert gone.status.value == "unknown" and "cannot probe the engine" in gone.summary


def test_the_check_is_skipped_unless_asked_and_notes_shared_uids(fake: Any) -> None:
    r = (
        run_doctor(ctx=Context(DoctorOptions(checks=["isolation"]), processes=lambda: []))
        .get("isolation")
        .result
    )
    assert r.status.value == "skip" and "--probe-isolation" in r.summary
    _, url = fake()
    opts = DoctorOptions(
        checks=["isolation"], probe_isolation=True, engine=url, daemon_flags={"allow_uid": ["1000"]}
    )
    r = run_doctor(ctx=Context(opts, processes=lambda: [])).get("isolation").result
    assert r.status.value == "ok", r.summary  # no daemon here, but the control (a reset, then a hit) ran
    assert any("not a security boundary" in d for d in r.details)


def test_cli_usage_errors_and_what_runs() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--probe-isolation"])
    assert res.exit_code == 2 and "--probe-isolation needs --engine URL" in res.output
    res = runner.invoke(app, ["doctor", "--probe-isolation", "--engine", "ftp://x"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["doctor", "--probe-isolation", "--engine", "http://127.0.0.1:1", "--json"])
    data = json.loads(res.stdout)
    assert [c["id"] for c in data["checks"]] == ["isolation", "arena-sharing"]
    assert data["checks"][0]["status"] == "unknown" and res.exit_code == 0
