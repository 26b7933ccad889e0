"""KVD3xx: block hashes and chunk keys, which must agree across processes for reuse to happen."""

from __future__ import annotations

from collections.abc import Iterator

from infera.keyrules import (
    AIS_ENV,
    CHUNK_TOKENS_ENV,
    DEFAULT_HASH_ALGO,
    HASH_ALGO_FLAG,
    ROOTS_ENV,
    SEED_ENV,
    SMALL_GPU_DIRECT_TOKENS,
    chunk_setting,
    fixed_seed_release,
    hash_seed_mode,
    python_hash_seed,
)
from infera.launch.model import Deployment, Leg
from infera.launch.rules.registry import Context, Hit, Severity, rule

SEED = SEED_ENV
CHUNK = CHUNK_TOKENS_ENV


def _keyed_legs(dep: Deployment) -> list[Leg]:
    """Legs whose block hashes leave the process: any leg with a KV connector."""
    return [leg for leg in dep.legs if leg.ktc() is not None or leg.kvd_env()]


def _seed_state(leg: Leg) -> str | None:
    """The seed value, ``"<unset>"``, or None when we cannot tell."""
    if SEED in leg.env:
        return leg.env[SEED]
    return "<unset>" if leg.env_complete else None


def _same_to_python(a: str, b: str) -> str:
    """A note when two different texts are one seed to Python (vLLM hashes the text, so they differ)."""
    try:
        seed = python_hash_seed(a)
        same = seed is not None and seed == python_hash_seed(b)
    except ValueError:
        return ""
    return f" (both are seed {seed} to Python, but vLLM seeds its block hashes from the text)" if same else ""


@rule(
    "KVD301",
    "hash-seed-mismatch",
    Severity.ERROR,
    "Every engine leg has the same PYTHONHASHSEED (or, on vLLM >= 0.29 with sha256, none has it).",
    "Set PYTHONHASHSEED=0 on every engine leg and keep it across restarts.",
)
def hash_seed(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Compares `PYTHONHASHSEED` across the engine legs that exchange KV (any leg with a kv-transfer-config
    or kvd variables):

    * legs with different values, or some set and some unset: **error**, on any vLLM version;
    * unset on every leg: **error** with `--vllm-version` 0.28 or older, or with
      `--prefix-caching-hash-algo xxhash*`; a **warning** when the vLLM version is unknown; fine on
      0.29 or later with the default `sha256`;
    * a value Python itself refuses to start with: **error**. Python takes an empty value or `random`
      (a random seed), or a decimal integer up to 4294967295 that may have leading whitespace, a `+`
      and leading zeros; it refuses trailing spaces, `0x10`, `1_000`, a negative number (`-0` passes)
      and a number above 4294967295.

    Values are compared as text, because vLLM seeds its hashes from the text: `PYTHONHASHSEED=' 0'`,
    `=+0` and `=0` are one seed to Python and three to vLLM, and an empty value counts as set.

    ## Why it matters
    vLLM seeds the chain of block hashes from `PYTHONHASHSEED`, and kvd's chunk keys are those hashes.
    Up to vLLM 0.28 an unset variable means a random seed per process, so two legs (or one engine
    before and after a restart) never compute the same key. From 0.29 an unset variable gives a fixed
    seed with `sha256`, but any value that is set gives a different one: a prefill leg with `0` and a
    decode leg without it disagree on every block. The miss is silent: the engine recomputes.

    This refines the product doc's "set PYTHONHASHSEED=0 on both legs": the rule is the *same* setting
    everywhere, and setting it everywhere is the choice that works on every vLLM version.

    ## Example
    ```sh
    PYTHONHASHSEED=0 python -m infera.engine.vllm ... --kv-transfer-config '{...kv_producer...}'   # prefill
    python -m infera.engine.vllm ... --kv-transfer-config '{...kv_consumer...}'                   # decode
    ```

    Use instead:
    ```sh
    PYTHONHASHSEED=0 python -m infera.engine.vllm ... --kv-transfer-config '{...kv_producer...}'  # prefill
    PYTHONHASHSEED=0 python -m infera.engine.vllm ... --kv-transfer-config '{...kv_consumer...}'  # decode
    ```

    ## Fix
    Set `PYTHONHASHSEED=0` on every engine process, in every file that starts one.
    """
    legs = _keyed_legs(dep)
    states = [(leg, _seed_state(leg)) for leg in legs]
    for leg, st in states:
        if st in (None, "<unset>"):
            continue
        try:
            python_hash_seed(st)
        except ValueError as exc:
            yield Hit(
                f"PYTHONHASHSEED={st!r} on leg {leg.name!r} {exc}: Python refuses to start "
                "(it takes 'random' or a decimal integer in [0, 4294967295])",
                leg.where_env(SEED),
            )
    known = [(leg, st) for leg, st in states if st is not None]
    if not known:
        return
    values = {st for _, st in known if st != "<unset>"}
    first_set = next(((leg, st) for leg, st in known if st != "<unset>"), None)
    if first_set is not None:
        ref_leg, ref = first_set
        for leg, st in known:
            if leg is ref_leg:
                continue
            if st == "<unset>":
                note = " (vLLM counts an empty value as set)" if ref == "" else ""
                yield Hit(
                    f"PYTHONHASHSEED is unset on leg {leg.name!r} but {ref!r} on {ref_leg.name!r}{note}: "
                    "the legs compute different block hashes and reuse silently misses",
                    leg.where(),
                )
            elif len(values) > 1 and st != ref:
                yield Hit(
                    f"PYTHONHASHSEED={st!r} on leg {leg.name!r} but {ref!r} on {ref_leg.name!r}"
                    f"{_same_to_python(st, ref)}: the legs compute different block hashes and reuse "
                    "silently misses",
                    leg.where_env(SEED),
                )
        return
    ver = ctx.vllm_version
    fixed = fixed_seed_release(ver)
    for leg, _ in known:
        algo = leg.flag_value(HASH_ALGO_FLAG) or DEFAULT_HASH_ALGO
        mode = hash_seed_mode(None, algo, fixed)
        if mode == "random" and ver is not None and fixed is False:
            yield Hit(
                f"PYTHONHASHSEED is unset on leg {leg.name!r}: on vLLM {ver[0]}.{ver[1]} every process "
                "seeds its block hashes randomly, so keys change on each restart",
                leg.where(),
            )
        elif mode == "random":
            yield Hit(
                f"PYTHONHASHSEED is unset on leg {leg.name!r} with {algo} block hashing: the seed is random per process",
                leg.where_flag(HASH_ALGO_FLAG),
            )
        elif mode == "unknown":
            yield Hit(
                f"PYTHONHASHSEED is unset on leg {leg.name!r}: keys are stable only on vLLM >= 0.29 with "
                "sha256 hashing (lint with --vllm-version to be sure)",
                leg.where(),
                severity=Severity.WARNING,
            )


@rule(
    "KVD302",
    "hash-algo-mismatch",
    Severity.ERROR,
    "Every engine leg uses the same --prefix-caching-hash-algo.",
    "Pass the same --prefix-caching-hash-algo to every leg, or leave it at the default everywhere.",
)
def hash_algo(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Compares `--prefix-caching-hash-algo` across the engine legs that exchange KV. A leg without the
    flag uses vLLM's default, `sha256`.

    ## Why it matters
    The hash algorithm decides every block hash, so two legs with different algorithms never share a
    key, even with the same seed and the same prompt.

    ## Example
    ```sh
    python -m infera.engine.vllm ... --prefix-caching-hash-algo sha256_cbor ...   # engine A
    python -m infera.engine.vllm ... ...                                          # engine B: sha256
    ```

    Use instead:
    ```sh
    python -m infera.engine.vllm ... --prefix-caching-hash-algo sha256_cbor ...   # engine A
    python -m infera.engine.vllm ... --prefix-caching-hash-algo sha256_cbor ...   # engine B
    ```

    ## Fix
    Choose one algorithm for the whole deployment.
    """
    legs = [leg for leg in _keyed_legs(dep) if leg.argv is not None]
    seen: list[tuple[Leg, str]] = []
    for leg in legs:
        use = leg.flag(HASH_ALGO_FLAG)
        if use is not None and leg.flag_value(HASH_ALGO_FLAG) is None:
            continue
        seen.append((leg, leg.flag_value(HASH_ALGO_FLAG) or "sha256"))
    if len({a for _, a in seen}) <= 1:
        return
    ref_leg, ref = seen[0]
    for leg, algo in seen[1:]:
        if algo != ref:
            yield Hit(
                f"leg {leg.name!r} hashes blocks with {algo}, leg {ref_leg.name!r} with {ref}: no key can match",
                leg.where_flag(HASH_ALGO_FLAG) if leg.has_flag(HASH_ALGO_FLAG) else leg.where(),
            )


@rule(
    "KVD303",
    "chunk-tokens-fixed",
    Severity.WARNING,
    f"INFERA_KVD_CHUNK_TOKENS is not pinned below {SMALL_GPU_DIRECT_TOKENS} tokens where GPU-direct reads are on.",
    "Remove INFERA_KVD_CHUNK_TOKENS (or set it to auto) so the connector sizes chunks from the model.",
)
def chunk_tokens_fixed(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Warns when `INFERA_KVD_CHUNK_TOKENS` is a fixed number below 128 tokens on a leg that
    asks for GPU-direct reads (`INFERA_KVD_AIS=1`, or `auto` with `INFERA_KVD_HIPFILE_ROOTS` set). `kvd doctor`
    (check `chunk-tokens`) gives the same verdict on running engines: both use `infera.keyrules`.

    ## Why it matters
    `auto` (the default) sizes chunks from the model's KV bytes per token. Where GPU-direct reads are on
    it picks at least 128 MiB per chunk, which is where the parallel file reads start to pay off; a chunk
    of fewer than 128 tokens stays under that for every model (even at 1 MiB of KV per token),
    so GPU-direct reloads become overhead-bound and run slower than recomputing the prefix.

    On the RAM path `auto` itself picks anything from one block (large models) to 256 tokens (small ones),
    so no fixed value is called small there: lint cannot see the model's KV bytes per token.

    ## Example
    ```sh
    INFERA_KVD_CHUNK_TOKENS=64 INFERA_KVD_AIS=1 INFERA_KVD_HIPFILE_ROOTS=long=/nvme/kvd-long \\
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm ...
    ```

    Use instead:
    {{AIS_ENGINE_SH}}

    ## Fix
    Drop the variable. If you must pin it (to keep keys stable across a model change), pin the value
    `auto` chose, which the engine log prints at start.
    """
    for leg in dep.legs:
        val = leg.env_value(CHUNK)
        if val is None:
            continue
        setting = chunk_setting(val, leg.env_value(AIS_ENV), leg.env_value(ROOTS_ENV))
        if setting.small is not None:
            yield Hit(
                f"INFERA_KVD_CHUNK_TOKENS={val} on leg {leg.name!r} is a small fixed chunk: {setting.small}",
                leg.where_env(CHUNK),
            )


@rule(
    "KVD304",
    "chunk-tokens-mismatch",
    Severity.ERROR,
    "Engines that share a daemon use the same INFERA_KVD_CHUNK_TOKENS.",
    "Give every engine on the daemon the same INFERA_KVD_CHUNK_TOKENS (best: leave it unset, i.e. auto).",
)
def chunk_tokens_mismatch(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Groups the legs that use kvd by the daemon socket they talk to and compares their
    `INFERA_KVD_CHUNK_TOKENS` (unset means `auto`).

    ## Why it matters
    The chunk size is part of a chunk's key. Two engines of one model on the same daemon with different
    chunk sizes store and look up different keys, so neither ever hits what the other stored, and a
    restart with another value orphans the whole disk tier. The daemon's `misses_total` grows while
    `hits_total` stays flat.

    ## Example
    ```sh
    INFERA_KVD_CHUNK_TOKENS=2048 INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --port 8000 ...
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --port 8001 ...
    ```

    Use instead:
    ```sh
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --port 8000 ...
    INFERA_KVD_SOCKET=/var/run/infera-kvd.sock python -m infera.engine.vllm --port 8001 ...
    ```

    ## Fix
    Use one value on every engine of the host; `auto` everywhere is the simple choice.
    """
    groups: dict[str | None, list[tuple[Leg, str]]] = {}
    for leg in dep.legs:
        if not (leg.uses_kvd() or "INFERA_KVD_SOCKET" in leg.env):
            continue
        if CHUNK in leg.env:
            val = leg.env[CHUNK]
            if val is None:
                continue
        elif leg.env_complete:
            val = "auto"
        else:
            continue
        groups.setdefault(leg.env.get("INFERA_KVD_SOCKET"), []).append((leg, val.lower()))
    for members in groups.values():
        ref_leg, ref = members[0]
        for leg, val in members[1:]:
            if val != ref:
                yield Hit(
                    f"INFERA_KVD_CHUNK_TOKENS is {val} on leg {leg.name!r} but {ref} on {ref_leg.name!r}: "
                    "they share a daemon and will never hit each other's chunks",
                    leg.where_env(CHUNK) if CHUNK in leg.env else leg.where(),
                )
