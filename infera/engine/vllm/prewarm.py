"""``POST /v1/cache/prewarm``: ask the daemon to pull a prompt's chunks from the long tier into RAM.

An agent harness calls it before the request that will need the prefix, so a disk read leaves
the time-to-first-token budget. The route derives chunk keys exactly as the scheduler half does
(same namespace, vLLM's own block hashing with the engine's hash settings) and sends one
PREWARM. Body: ``{"prompt": "text" | [token ids], "model": optional}``; reply
``{"chunks": n, "queued": k, "namespace": ...}``. Errors are JSON ``{"error": {...}}``
with a 4xx/5xx status, never a traceback.
"""

# No ``from __future__ import annotations`` here: FastAPI must see the route's real ``Request``
# annotation, which lives inside make_router so that fastapi is imported only when serving.
from typing import Any

from infera.engine.vllm import compat
from infera.engine.vllm.config import ConnectorEnv, read_env
from infera.engine.vllm.keys import Namespace, chunk_hashes, lookup_keys

PREWARM_PATH = "/v1/cache/prewarm"


def prompt_keys(
    vllm_config: Any, token_ids: list[int], env: ConnectorEnv | None = None
) -> tuple[Namespace, list[bytes], int]:
    """(namespace, keys of every rank for every whole chunk of the prompt, number of chunks)."""
    env = env or read_env()
    ns = compat.namespace_for(vllm_config, env)
    facts = compat.engine_facts(vllm_config)
    hashes = chunk_hashes(
        compat.block_hashes_for(vllm_config, token_ids), ns.chunk_tokens, facts.block_size, len(token_ids)
    )
    ranks = 1 if facts.replicated else facts.tp_size * facts.pp_size
    return ns, lookup_keys(ns.digest, hashes, ranks), len(hashes)


class PrewarmError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _tokens(body: Any, tokenizer: Any) -> list[int]:
    if not isinstance(body, dict) or "prompt" not in body:
        raise PrewarmError(400, "bad_request", 'the body must be a JSON object with "prompt"')
    prompt = body["prompt"]
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise PrewarmError(
                400, "no_tokenizer", "this server has no tokenizer (--skip-tokenizer-init); send token ids"
            )
        return list(tokenizer.encode(prompt))
    raise PrewarmError(400, "bad_request", '"prompt" must be a string or a list of token ids')


def prewarm(
    socket_path: str, vllm_config: Any, body: Any, tokenizer: Any = None, served: Any = ()
) -> dict[str, Any]:
    """Handle one prewarm body; raises PrewarmError with the HTTP status to answer."""
    from infera.kvd.client import KvdClient, KvdClientError, KvdUnavailable, KvdUnsupported

    model = body.get("model") if isinstance(body, dict) else None
    names = {str(vllm_config.model_config.model), *[str(n) for n in served or ()]}
    if model is not None and str(model) not in names:
        raise PrewarmError(404, "model_not_found", f"this server serves {sorted(names)}, not {model!r}")
    token_ids = _tokens(body, tokenizer)
    try:
        ns, keys, chunks = prompt_keys(vllm_config, token_ids)
    except ValueError as exc:
        raise PrewarmError(409, "keys_unavailable", str(exc)) from None
    if not keys:
        return {"chunks": 0, "queued": 0, "namespace": ns.name}
    try:
        with KvdClient(
            socket_path, namespace=ns.name, name="prewarm", role="prewarm", want_arena=False
        ) as client:
            queued = client.prewarm(keys)
    except KvdUnsupported as exc:
        raise PrewarmError(501, "no_long_tier", str(exc)) from None
    except KvdUnavailable as exc:
        raise PrewarmError(503, "daemon_unavailable", str(exc)) from None
    except KvdClientError as exc:
        raise PrewarmError(502, "daemon_error", str(exc)) from None
    return {"chunks": chunks, "queued": queued, "namespace": ns.name}


def make_router(socket_path: str) -> Any:
    """A FastAPI router with the prewarm route; the engine client comes from ``app.state``."""
    import asyncio

    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse

    router = APIRouter()

    @router.post(PREWARM_PATH)
    async def cache_prewarm(request: Request) -> JSONResponse:
        try:
            try:
                body = await request.json()
            except ValueError:
                raise PrewarmError(400, "bad_request", "the body is not valid JSON") from None
            engine = getattr(request.app.state, "engine_client", None)
            if engine is None:
                raise PrewarmError(503, "not_ready", "the engine is not ready yet")
            served = getattr(getattr(request.app.state, "args", None), "served_model_name", None) or ()
            result = await asyncio.to_thread(
                prewarm, socket_path, engine.vllm_config, body, getattr(engine, "tokenizer", None), served
            )
        except PrewarmError as exc:
            return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=exc.status)
        return JSONResponse(result)

    return router
