"""Facts about the host that checks share: parsers for host formats and memoized readers.

Parsers are pure functions of text (tested on reconstructed samples); readers take a
:class:`~infera.doctor.context.Context` and return typed facts with the evidence they read.
"""
