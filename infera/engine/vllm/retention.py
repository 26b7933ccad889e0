"""Per-request retention (``kv_transfer_params.infera_retention``): which class a request's chunks
are stored under, read by the scheduler half (docs/connector.md, "Per-request retention")."""

from __future__ import annotations

import logging

log = logging.getLogger("infera.engine.vllm")

RETENTIONS = ("none", "short", "long")
RETENTION_KEY = "infera_retention"
MAX_UNKNOWN_RETENTIONS = 32  # distinct unknown values remembered for the warn-once logic
SHOWN_CHARS = 64  # how much of an unknown value a log line shows


class _WarnOnce:
    """Warn once per distinct unknown retention value, in bounded memory and bounded log.

    Any HTTP client chooses ``kv_transfer_params``, so neither the remembered values nor the log
    may grow with what clients send: at most ``limit`` values are remembered (each by a short
    key, never the value itself), and once that many were seen one last line says that further
    values go unlogged; they are only counted.
    """

    def __init__(self, limit: int = MAX_UNKNOWN_RETENTIONS) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.unlogged = 0

    def warn(self, key: str, message: str, *args: object) -> None:
        if key in self.seen:
            return
        if len(self.seen) >= self.limit:
            if self.unlogged == 0:
                log.warning(
                    "kv_transfer_params.%s: %d distinct unknown values seen; not logging any more of them",
                    RETENTION_KEY,
                    self.limit,
                )
            self.unlogged += 1
            return
        self.seen.add(key)
        log.warning(message, *args)


_unknown_retentions = _WarnOnce()


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``repr`` of at most ``limit`` characters of ``text``, and its length when it was cut."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def retention_of(params: object) -> str:
    """The retention class a request asked for in ``kv_transfer_params``.

    ``ephemeral`` maps to ``long`` (the product doc: ephemeral and TTL are daemon-side only);
    anything unknown, and anything that is not a string, maps to ``long`` with one (short)
    warning per distinct value, for the first :data:`MAX_UNKNOWN_RETENTIONS` of them.
    """
    if not isinstance(params, dict):
        return "long"
    value = params.get(RETENTION_KEY)
    if value is None:
        return "long"
    if not isinstance(value, str):
        kind = type(value).__name__
        _unknown_retentions.warn(
            f"<{kind}>",
            "kv_transfer_params.%s is a %s, not one of the strings none|short|long; treating it as long",
            RETENTION_KEY,
            kind,
        )
        return "long"
    # The longest valid value is 9 characters: a longer one is unknown without copying it.
    text = value.strip().lower() if len(value) <= SHOWN_CHARS else value
    if text in RETENTIONS:
        return text
    if text == "ephemeral":
        return "long"
    key = shown(value)
    _unknown_retentions.warn(
        key,
        "kv_transfer_params.%s=%s is not one of none|short|long; treating it as long",
        RETENTION_KEY,
        key,
    )
    return "long"
