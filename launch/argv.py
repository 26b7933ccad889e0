"""How ``kvd launch`` and ``kvd lint`` read a command line: flag uses the way argparse would
split them, the switches of the programs we meet (vLLM engines, vllm-router), and where each
value was written (:class:`Loc`, for findings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# vllm-router's switches and its options that take several words (argparse nargs="+"/"*")
ROUTER_SWITCHES = frozenset(
    {
        "--vllm-pd-disaggregation",
        "--enable-program-scheduling",
        "--mini-lb",
        "--enable-igw",
        "--service-discovery",
        "--disable-retries",
        "--disable-circuit-breaker",
    }
)
ROUTER_MULTI = frozenset(
    {
        "--prefill",
        "--worker-urls",
        "--selector",
        "--prefill-selector",
        "--decode-selector",
        "--request-id-headers",
    }
)


@dataclass(frozen=True)
class Loc:
    """Where a value was written: file, 1-based line and column, and the span of its command."""

    path: str
    line: int
    col: int = 1
    first_line: int | None = None
    last_line: int | None = None

    def lines(self) -> range:
        """Lines on which a suppression comment applies to a finding at this place."""
        lo = min(self.line, self.first_line or self.line)
        hi = max(self.line, self.last_line or self.line)
        return range(lo, hi + 1)


# Engine flags that never take a value (vLLM's store_true flags we are likely to meet).
ENGINE_BOOL_FLAGS = frozenset(
    {
        "--enable-prefix-caching",
        "--trust-remote-code",
        "--enforce-eager",
        "--disable-log-stats",
        "--disable-log-requests",
        "--enable-log-requests",
        "--enable-chunked-prefill",
        "--disable-custom-all-reduce",
        "--enable-expert-parallel",
        "--disable-frontend-multiprocessing",
        "--enable-auto-tool-choice",
        "--skip-tokenizer-init",
        "--enable-lora",
        "--headless",
        "--enable-sleep-mode",
        "--async-scheduling",
        "--disable-uvicorn-access-log",
        "--disable-hybrid-kv-cache-manager",
        "--disable-sliding-window",
        "--enable-eplb",
        "--enable-prompt-tokens-details",
    }
)


@dataclass
class FlagUse:
    """One ``--flag [value]`` occurrence in an argv."""

    name: str
    value: str | None
    index: int
    value_index: int | None = None
    more: list[int] = field(default_factory=list)  # indices of further values (``--prefill URL PORT``)


def _is_bool_flag(name: str, bool_flags: frozenset[str]) -> bool:
    return name in bool_flags or name.startswith(("--no-", "--enable-", "--disable-"))


def parse_flags(
    argv: list[str],
    start: int,
    bool_flags: frozenset[str] = ENGINE_BOOL_FLAGS,
    multi_flags: frozenset[str] = frozenset(),
) -> list[FlagUse]:
    """Split ``argv[start:]`` into flag uses, the way argparse would for long options; a flag of
    ``multi_flags`` (argparse ``nargs="+"``) keeps every word up to the next option."""
    out: list[FlagUse] = []
    i = start
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--") and len(tok) > 2:
            if "=" in tok:
                name, _, value = tok.partition("=")
                out.append(FlagUse(name, value, i, i))
                i += 1
                continue
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            takes_value = (
                nxt is not None
                and not _is_bool_flag(tok, bool_flags)
                and not (nxt.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", nxt))
            )
            if takes_value:
                use = FlagUse(tok, nxt, i, i + 1)
                out.append(use)
                i += 2
                while tok in multi_flags and i < len(argv) and not argv[i].startswith("--"):
                    use.more.append(i)
                    i += 1
            else:
                out.append(FlagUse(tok, None, i, None))
                i += 1
        else:
            i += 1
    return out


__all__ = ["ENGINE_BOOL_FLAGS", "ROUTER_MULTI", "ROUTER_SWITCHES", "FlagUse", "Loc", "parse_flags"]
