"""``POST /v1/cache/prewarm``: ask the daemon to pull a prompt's chunks from the long tier into RAM.

An agent harness calls it before the request that will need the prefix, so a disk read leaves
the time-to-first-token budget. The route derives chunk keys exactly as the scheduler half does
(same namespace, vLLM's own block hashing with the engine's hash settings) and sends one
PREWARM. Body: ``{"prompt": "text" | [token ids], "model": optional}``; reply
``{"chunks": n, "queued": k, "namespace": ...}``. The prompt is checked as vLLM checks a
request's (non-empty, integer ids inside the vocabulary, at most ``max_model_len`` tokens).
Errors are JSON ``{"error": {"code", "message"}}`` with a 4xx/5xx status, never a traceback.
"""

# No ``from __future__ import annotations`` here: FastAPI must see the route's real ``Request``
# annotation, which lives inside make_router so that fastapi is imported only when serving.
from typing import Any

from infera.engine.vllm import compat, groups
from infera.engine.vllm.config import ConnectorEnv, read_env
from infera.engine.vllm.keys import Namespace, chunk_hashes
from infera.engine.vllm.retention import shown

PREWARM_PATH = "/v1/cache/prewarm"


def prompt_keys(
    vllm_config: Any,
    token_ids: list[int],
    env: ConnectorEnv | None = None,
    plan: groups.Plan | None = None,
) -> tuple[Namespace, list[bytes], int]:
    """(namespace, keys of every rank and KV cache group for every whole chunk of the prompt,
    number of chunks). ``plan``: the engine's groups (a hybrid model; the API server has no KV
    cache config, so :func:`declared_plan` reads what the engine core declared to the daemon)."""
    env = env or read_env()
    ns = compat.namespace_for(vllm_config, env)
    facts = compat.engine_facts(vllm_config)
    hashes = chunk_hashes(
        compat.block_hashes_for(vllm_config, token_ids), ns.chunk_tokens, facts.block_size, len(token_ids)
    )
    ranks = 1 if facts.replicated else facts.tp_size * facts.pp_size
    plan = plan or groups.single_group(facts.block_size, ns.chunk_tokens)
    keys, _per_chunk = groups.plan_keys(plan, ns.digest, hashes, ranks)
    return ns, keys, len(hashes)


def declared_plan(stats: dict[str, Any], namespace: str, chunk_tokens: int) -> groups.Plan | None:
    """The KV cache groups the engine core of ``namespace`` declared at HELLO (``kv_layout``),
    when it has more than one; None otherwise."""
    for c in stats.get("clients", []):
        layout = c.get("kv_layout")
        if c.get("namespace") != namespace or not str(c.get("role", "")).endswith("scheduler"):
            continue
        if isinstance(layout, dict) and len(layout.get("groups") or []) > 1:
            try:
                return groups.Plan.from_wire(layout["groups"], chunk_tokens)
            except (KeyError, TypeError, ValueError):
                return None
    return None


class PrewarmError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def check_prompt(token_ids: Any, vocab_size: int | None, max_model_len: int | None) -> list[int]:
    """The prompt's token ids, checked as vLLM checks a request's: a non-empty list of integers
    in ``0 .. vocab_size - 1``, at most ``max_model_len`` long (a bound that is None is not
    checked). Raises PrewarmError (400) saying what is wrong."""
    if not isinstance(token_ids, list):
        raise PrewarmError(400, "bad_request", '"prompt" must be a string or a list of token ids')
    if not token_ids:
        raise PrewarmError(400, "empty_prompt", "the prompt is empty")
    if max_model_len is not None and len(token_ids) > max_model_len:
        raise PrewarmError(
            400,
            "prompt_too_long",
            f"prompt of {len(token_ids)} tokens exceeds max_model_len {max_model_len}",
        )
    for pos, tok in enumerate(token_ids):
        if not isinstance(tok, int) or isinstance(tok, bool):
            raise PrewarmError(
                400,
                "bad_request",
                f"token id at position {pos} is not an integer: {_short(tok)}",
            )
        if tok < 0:
            raise PrewarmError(400, "invalid_token", f"token id {_short(tok)} at position {pos} is negative")
        if vocab_size is not None and tok >= vocab_size:
            raise PrewarmError(
                400,
                "invalid_token",
                f"token id {_short(tok)} at position {pos} is outside the vocabulary (size {vocab_size})",
            )
    return list(token_ids)


def _short(value: Any) -> str:
    """A bounded description of one JSON value a client sent."""
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, str):
        return shown(value, 40)
    return f"a {type(value).__name__}"


def prompt_limits(vllm_config: Any, tokenizer: Any = None) -> tuple[int | None, int | None]:
    """(vocabulary size, max_model_len) of the served model; None where it cannot be told.

    The vocabulary is the larger of the model's and the tokenizer's, as vLLM's own check."""
    model_config = getattr(vllm_config, "model_config", None)
    vocab: int | None = None
    try:
        vocab = int(model_config.get_vocab_size())  # type: ignore[union-attr]
    except Exception:
        vocab = None
    top = getattr(tokenizer, "max_token_id", None)
    if isinstance(top, int) and vocab is not None:
        vocab = max(vocab, top + 1)
    limit = getattr(model_config, "max_model_len", None)
    return vocab, int(limit) if isinstance(limit, int) and limit > 0 else None


def _tokens(
    body: Any, tokenizer: Any, vocab_size: int | None = None, max_model_len: int | None = None
) -> list[int]:
    if not isinstance(body, dict) or "prompt" not in body:
        raise PrewarmError(400, "bad_request", 'the body must be a JSON object with "prompt"')
    prompt = body["prompt"]
    if isinstance(prompt, str):
        if not prompt:
            raise PrewarmError(400, "empty_prompt", "the prompt is empty")
        if tokenizer is None:
            raise PrewarmError(
                400, "no_tokenizer", "this server has no tokenizer (--skip-tokenizer-init); send token ids"
            )
        # the tokenizer's ids are in its vocabulary; the length still has to fit
        return check_prompt(list(tokenizer.encode(prompt)), None, max_model_len)
    return check_prompt(prompt, vocab_size, max_model_len)


def prewarm(
    socket_path: str, vllm_config: Any, body: Any, tokenizer: Any = None, served: Any = ()
) -> dict[str, Any]:
    """Handle one prewarm body; raises PrewarmError with the HTTP status to answer."""
    from infera.kvd.client import KvdClient, KvdClientError, KvdUnavailable, KvdUnsupported

    model = body.get("model") if isinstance(body, dict) else None
    names = {str(vllm_config.model_config.model), *[str(n) for n in served or ()]}
    if model is not None and str(model) not in names:
        raise PrewarmError(404, "model_not_found", f"this server serves {sorted(names)}, not {model!r}")
    token_ids = _tokens(body, tokenizer, *prompt_limits(vllm_config, tokenizer))
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
            if compat.is_hybrid_model(vllm_config):  # every group's keys, as the engine declared them
                plan = declared_plan(client.stats(), ns.name, ns.chunk_tokens)
                if plan is not None:
                    ns, keys, chunks = prompt_keys(vllm_config, token_ids, plan=plan)
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
