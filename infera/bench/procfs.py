"""What Linux's /proc says about a running process: resident memory, threads, CPU time, descriptors.

``kvd bench arena`` measures the daemon's own memory with it; the hostile tests watch a daemon's
memory, threads, CPU and descriptors while a client misbehaves.
"""

from __future__ import annotations

import os


def status_field(pid: int, name: str) -> int:
    """The number of field ``name`` of /proc/PID/status (``VmRSS``, ``Threads``, ...) as written
    there (memory in KiB); 0 when the field is absent."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def rss_bytes(pid: int) -> int:
    """Resident set size in bytes."""
    return status_field(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size in bytes (VmHWM): catches a transient spike too."""
    return status_field(pid, "VmHWM") * 1024


def rss_anon_bytes(pid: int) -> int:
    """Anonymous resident memory in bytes (excludes a shared mapping such as the daemon's arena)."""
    return status_field(pid, "RssAnon") * 1024


def threads(pid: int) -> int:
    """Number of threads."""
    return status_field(pid, "Threads")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    """How many descriptors are open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


__all__ = [
    "cpu_seconds",
    "open_fds",
    "peak_rss_bytes",
    "rss_anon_bytes",
    "rss_bytes",
    "status_field",
    "threads",
]
