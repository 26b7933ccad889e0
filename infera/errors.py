"""Errors users can act on.

Every error raised across a package boundary is a :class:`KvdError`: a one-line message plus an
optional hint saying what to do next. The CLI prints ``error: <message>`` and ``hint: <hint>`` and
exits non-zero; it never prints a traceback for a ``KvdError``.
"""

from __future__ import annotations


class KvdError(Exception):
    """Base class of every error infera-kvd reports to a user or a calling program."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(KvdError):
    """Bad input on a command line or in a config file (exit status 2)."""

    exit_code = 2
