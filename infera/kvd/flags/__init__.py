"""The daemon's flags: one table that ``kvd serve``, ``kvd launch``, ``kvd lint`` and ``kvd doctor`` use.

Each :class:`Flag` holds a flag's name, kind, default (as typed on a command line), environment
variable, help and validator. :func:`check` validates a full set of values once for everyone: each
flag with its own validator, then the rules between flags (the long tier and its settings).
``build_config`` raises the first problem, ``kvd lint`` reports each one, ``kvd launch`` refuses the
first. :mod:`infera.kvd.flagopts` turns the table into Typer options.

The package holds the validators (:mod:`.parse`), the table (:mod:`.table`) and the check of a
full set of values (:mod:`.values`); what the tools use is re-exported here. Only the standard
library, :mod:`infera.errors` and the units of :mod:`infera.units` are imported, so the tools read
the table without loading the daemon's runtime modules.

Adding a flag is one entry in :data:`FLAGS` of :mod:`.table` (with an example of a bad value, for
the tests), plus the :class:`~infera.kvd.config.DaemonConfig` field of the same name that the
daemon reads.
"""

from __future__ import annotations

from infera.kvd.flags.parse import DISTRIBUTED, UNKNOWN, Uids, parse_master
from infera.kvd.flags.table import BY_DEST, BY_NAME, FLAGS, SWITCHES, Flag
from infera.kvd.flags.values import Checked, FlagValues, Problem, check

__all__ = [
    "BY_DEST",
    "BY_NAME",
    "DISTRIBUTED",
    "FLAGS",
    "SWITCHES",
    "UNKNOWN",
    "Checked",
    "Flag",
    "FlagValues",
    "Problem",
    "Uids",
    "check",
    "parse_master",
]
