"""The isolation probe: does a running engine with kvd keep tenants' ``cache_salt`` apart?

vLLM puts ``cache_salt`` into the first block's hash, so the chain hash of every block, and with
it every kvd key, differs between salts (vLLM 0.26 and 0.32 ``kv_cache_utils``). Whether a given
engine and connector *honour* that is what peers got wrong (a connector that recomputes hashes
from the tokens alone serves tenant A's KV to tenant B). This probe checks it from outside, as a
tenant would, on a prompt nobody sent before:

1. tenant A sends the prompt with ``cache_salt`` A, and the daemon's ``sets_total`` shows it was stored;
2. tenant B sends the same prompt with ``cache_salt`` B, then the same prompt goes with no salt;
   neither may be an external prefix-cache hit, by the engine's counters
   (``vllm:external_prefix_cache_hits``; per request when the server reports
   ``prompt_tokens_details``) and by the daemon's (``hits_total``);
3. the control: the engine's own prefix cache is reset (``POST /reset_prefix_cache``, which needs
   ``VLLM_SERVER_DEV_MODE=1``) and tenant A sends its prompt again, which must hit, so the probe
   is shown able to see a hit at all.

A cross-tenant hit is a failure. The prompt is random token ids below 1000 (valid for any model),
two chunks and a little long, with one output token per request. The counters are engine-wide:
run it on an idle engine, or give the server ``--enable-prompt-tokens-details`` for per-request
numbers.
"""

from __future__ import annotations

import json
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infera.doctor.model import CheckResult, Evidence, Status

EXT_HITS = "vllm:external_prefix_cache_hits"
EXT_QUERIES = "vllm:external_prefix_cache_queries"
LOCAL_HITS = "vllm:prefix_cache_hits"
DEFAULT_CHUNK = 256
TOKEN_RANGE = (10, 990)


class EngineError(Exception):
    """The engine could not be asked (unreachable, an HTTP error, a reply we cannot read)."""


class Engine:
    """An OpenAI-compatible vLLM server at ``url`` (``http://host:port``, with or without ``/v1``)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        self.url = re.sub(r"/v1/?$", "", url.rstrip("/"))
        self.api_key = api_key
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EngineError(f"{method} {self.url}{path}: {reason}") from None

    def models(self) -> list[dict[str, Any]]:
        code, text = self._call("GET", "/v1/models")
        if code != 200:
            raise EngineError(f"GET {self.url}/v1/models answered {code}: {text[:200]}")
        try:
            return list(json.loads(text).get("data") or [])
        except (ValueError, AttributeError):
            raise EngineError(f"GET {self.url}/v1/models: not the OpenAI models list") from None

    def metrics(self) -> dict[str, float]:
        """Prometheus counters by name (labels summed), ``_total`` dropped."""
        code, text = self._call("GET", "/metrics")
        if code != 200:
            raise EngineError(f"GET {self.url}/metrics answered {code}")
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
            if not m:
                continue
            name = m.group(1).removesuffix("_total")
            try:
                out[name] = out.get(name, 0.0) + float(m.group(3))
            except ValueError:
                continue
        return out

    def complete(self, model: str, ids: list[int], salt: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        code, text = self._call("POST", "/v1/completions", body)
        if code != 200:
            raise EngineError(f"POST {self.url}/v1/completions answered {code}: {text[:300]}")
        try:
            out: dict[str, Any] = json.loads(text)
        except ValueError:
            raise EngineError("the completion reply is not JSON") from None
        return out

    def reset_prefix_cache(self) -> tuple[bool, str]:
        code, _ = self._call("POST", "/reset_prefix_cache")
        return code == 200, f"POST /reset_prefix_cache answered {code}"


@dataclass
class Step:
    """One request of the probe and what each counter said about it."""

    name: str
    salt: str | None
    ext_hits: float = 0.0
    ext_queries: float = 0.0
    local_hits: float = 0.0
    cached: int | None = None  # usage.prompt_tokens_details.cached_tokens, when the server reports it
    daemon_hits: int | None = None
    daemon_sets: int | None = None

    @property
    def hits(self) -> float:
        """External hit tokens of this request: per request when known, else the engine-wide delta."""
        if self.cached is not None:
            return max(0.0, self.cached - self.local_hits) if self.local_hits else float(self.cached)
        return self.ext_hits

    def describe(self) -> str:
        salt = f"cache_salt {self.salt!r}" if self.salt else "no cache_salt"
        parts = [f"external hits {self.ext_hits:.0f} of {self.ext_queries:.0f} queried tokens"]
        if self.cached is not None:
            parts.append(f"cached_tokens {self.cached}")
        if self.daemon_hits is not None:
            parts.append(f"daemon hits +{self.daemon_hits} sets +{self.daemon_sets}")
        return f"{self.name} ({salt}): " + ", ".join(parts)


@dataclass
class Probe:
    engine: Engine
    daemon_stats: Callable[[], dict[str, Any] | None]
    rng: random.Random = field(default_factory=random.SystemRandom)
    settle_s: float = 10.0
    steps: list[Step] = field(default_factory=list)

    def _counters(self) -> tuple[dict[str, float], dict[str, Any] | None]:
        return self.engine.metrics(), self.daemon_stats()

    def _send(self, name: str, model: str, ids: list[int], salt: str | None) -> Step:
        m0, d0 = self._counters()
        reply = self.engine.complete(model, ids, salt)
        step = Step(name, salt)
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        if isinstance(details.get("cached_tokens"), int):
            step.cached = int(details["cached_tokens"])
        deadline = time.monotonic() + self.settle_s
        while True:  # the engine records a request's counters as it finishes: wait for them
            m1, d1 = self._counters()
            if m1.get(EXT_QUERIES, 0) - m0.get(EXT_QUERIES, 0) >= len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        step.ext_hits = m1.get(EXT_HITS, 0) - m0.get(EXT_HITS, 0)
        step.ext_queries = m1.get(EXT_QUERIES, 0) - m0.get(EXT_QUERIES, 0)
        step.local_hits = m1.get(LOCAL_HITS, 0) - m0.get(LOCAL_HITS, 0)
        if d0 is not None and d1 is not None:
            step.daemon_hits = int(d1.get("hits_total", 0)) - int(d0.get("hits_total", 0))
            step.daemon_sets = int(d1.get("sets_total", 0)) - int(d0.get("sets_total", 0))
        self.steps.append(step)
        return step

    def _wait_stored(self, before: dict[str, Any] | None) -> int | None:
        if before is None:
            return None
        deadline = time.monotonic() + self.settle_s
        while True:
            now = self.daemon_stats()
            if now is None:
                return None
            grown = int(now.get("sets_total", 0)) - int(before.get("sets_total", 0))
            if grown > 0 or time.monotonic() > deadline:
                return grown
            time.sleep(0.2)

    def run(self) -> CheckResult:
        ev: list[Evidence] = []
        try:
            models = self.engine.models()
            if not models:
                return CheckResult(
                    Status.UNKNOWN, f"{self.engine.url} serves no model (GET /v1/models is empty)", ev
                )
            model = str(models[0].get("id"))
            max_len = models[0].get("max_model_len")
            metrics = self.engine.metrics()
        except EngineError as exc:
            return CheckResult(
                Status.UNKNOWN,
                f"cannot probe the engine ({exc})",
                ev,
                fix="give --engine the URL of a running vLLM OpenAI server",
            )
        if EXT_QUERIES not in metrics:
            return CheckResult(
                Status.UNKNOWN,
                f"{self.engine.url} exports no {EXT_QUERIES} counter: it runs without a KV connector, so there is no external cache to probe",
                ev,
                fix="start the engine with kvd's connector (python -m infera.engine.vllm, or --kv-transfer-config for InferaKvdConnector)",
            )
        stats = self.daemon_stats()
        chunks = [
            int(c["chunk_tokens"])
            for c in (stats or {}).get("clients", [])
            if isinstance(c.get("chunk_tokens"), int)
        ]
        chunk = max(chunks) if chunks else DEFAULT_CHUNK
        n = 2 * chunk + 16
        if isinstance(max_len, int) and n + 2 > max_len:
            n = max_len - 2
            if n < chunk + 16:
                return CheckResult(
                    Status.UNKNOWN,
                    f"the engine's max_model_len ({max_len}) is below one chunk ({chunk} tokens) and a little: nothing would be stored",
                    ev,
                )
        ids = [self.rng.randrange(*TOKEN_RANGE) for _ in range(n)]
        tag = f"{self.rng.getrandbits(48):012x}"
        salt_a, salt_b = f"kvd-probe-{tag}-a", f"kvd-probe-{tag}-b"
        ev.append(
            Evidence(
                self.engine.url,
                f"model {model}; prompt of {n} random token ids (chunk {chunk} tokens)",
                "probe",
            )
        )
        try:
            before = self.daemon_stats()
            self._send("tenant A", model, ids, salt_a)
            stored = self._wait_stored(before)
            b = self._send("tenant B, same prompt", model, ids, salt_b)
            c = self._send("no salt, same prompt", model, ids, None)
            reset, reset_text = self.engine.reset_prefix_cache()
            d = (
                self._send("tenant A again, after a prefix-cache reset (the control)", model, ids, salt_a)
                if reset
                else None
            )
        except EngineError as exc:
            return CheckResult(Status.UNKNOWN, f"the probe's requests failed ({exc})", ev)
        ev += [Evidence(self.engine.url, s.describe(), "probe") for s in self.steps]
        if stored is not None:
            ev.append(Evidence("daemon", f"sets_total +{stored} after tenant A's request", "daemon"))
        details = [
            "engine counters are engine-wide: traffic from others during the probe counts too"
            + (
                ""
                if any(s.cached is not None for s in self.steps)
                else " (--enable-prompt-tokens-details gives per-request numbers)"
            )
        ]
        leaks = [s for s in (b, c) if s.hits > 0]
        if leaks:
            worst = max(leaks, key=lambda s: s.hits)
            daemon = f"; the daemon served {worst.daemon_hits} chunks for it" if worst.daemon_hits else ""
            return CheckResult(
                Status.FAIL,
                f"CROSS-TENANT HIT: {worst.name} ({'cache_salt ' + repr(worst.salt) if worst.salt else 'no cache_salt'}) got "
                f"{worst.hits:.0f} prompt tokens from the external cache that tenant A's request (cache_salt {salt_a!r}) "
                f"stored{daemon}. Tenants with different cache_salt read each other's KV",
                ev,
                fix="the engine's KV connector drops cache_salt from its keys: do not serve several tenants from it; "
                "report it with `kvd doctor --probe-isolation --json`",
                details=details,
            )
        quiet_daemon = [s for s in (b, c) if s.daemon_hits]
        if quiet_daemon:
            details.append(
                f"the daemon served {quiet_daemon[0].daemon_hits} chunks during {quiet_daemon[0].name} that the engine did not count (other engines' traffic?)"
            )
        if d is not None and d.hits <= 0:
            return CheckResult(
                Status.WARN,
                "no cross-tenant hit, but the control (tenant A again after a prefix-cache reset) got no external hit "
                "either: the probe could not see a hit at all, so this proves nothing",
                ev,
                fix="check that the engine stores into kvd (`kvd stat`: its clients, sets_total) and that prompts of "
                f"{n} tokens fill a chunk",
                details=details,
            )
        if d is None and not stored:
            why = (
                "no daemon counters (give --socket)"
                if stored is None
                else "the daemon stored nothing for tenant A"
            )
            return CheckResult(
                Status.WARN,
                f"no cross-tenant hit, but nothing shows the probe could have seen one: {reset_text} and {why}",
                ev,
                fix="run the server with VLLM_SERVER_DEV_MODE=1 (for the control) and give --socket of its kvd daemon",
                details=details,
            )
        proof = (
            f"tenant A's own request hit {d.hits:.0f} tokens after a prefix-cache reset (the control)"
            if d is not None
            else f"tenant A's prompt was stored (daemon sets_total +{stored}); the control was skipped ({reset_text}: needs VLLM_SERVER_DEV_MODE=1)"
        )
        return CheckResult(
            Status.OK,
            f"cache_salt keeps tenants apart: another salt and no salt got 0 external hits on a prompt of {n} tokens "
            f"tenant A stored; {proof}",
            ev,
            details=details,
        )
