"""``kvd doctor``: a preflight for kvd and GPU-direct L3 (AMD AIS/hipFile, NVIDIA GDS/cuFile).

Each check is a small function in :mod:`infera.doctor.checks` registered with
:func:`infera.doctor.registry.check`; it reads the host only through the :class:`Context` it is
given (files under ``--root``, commands through one runner, processes, the daemon), so every
check runs the same way on a live machine, on a mounted host tree and on test fixtures.
"""

from __future__ import annotations

from infera.doctor.context import Context, DoctorOptions
from infera.doctor.model import CheckResult, Evidence, Status
from infera.doctor.run import Report, run_doctor

__all__ = ["CheckResult", "Context", "DoctorOptions", "Evidence", "Report", "Status", "run_doctor"]
