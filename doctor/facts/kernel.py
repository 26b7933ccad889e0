"""Kernel facts: symbols in ``/proc/kallsyms``, the kernel config, and the kernel log.

``/proc/kallsyms`` and ``/proc/config.gz`` come from the running kernel, so they are trustworthy in
a container too; ``/boot`` and ``/lib/modules`` are files of whatever filesystem we are in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infera.doctor.context import Context
from infera.doctor.model import Evidence
from infera.doctor.runner import CommandResult

#: Symbols that exist only when the kernel was built with CONFIG_PCI_P2PDMA.
P2PDMA_SYMBOLS = ("p2pdma_pgmap_ops", "pci_p2pdma_add_resource")
#: The symbol ais-check's ``amdgpu`` line looks for: the loaded amdgpu has the AIS read/write path.
AIS_SYMBOL = "kfd_ais_rw_file"
_WANTED = (*P2PDMA_SYMBOLS, AIS_SYMBOL)


@dataclass
class Kallsyms:
    found: set[str]
    source: str
    error: str | None = None

    @property
    def readable(self) -> bool:
        return self.error is None


def kallsyms(ctx: Context) -> Kallsyms:
    def read(c: Context) -> Kallsyms:
        r = c.host.read("/proc/kallsyms", limit=None)  # module symbols come last; never truncate
        src = c.host.display("/proc/kallsyms")
        if r.text is None:
            return Kallsyms(set(), src, r.error)
        if not r.text.strip():
            return Kallsyms(set(), src, "empty")
        pat = re.compile(r"^\S+\s+\S\s+(" + "|".join(_WANTED) + r")(?:\s|$)", re.M)
        return Kallsyms({m.group(1) for m in pat.finditer(r.text)}, src)

    return ctx.memo("kallsyms", read)


@dataclass
class ConfigValue:
    """``CONFIG_PCI_P2PDMA`` as one config source states it (``y``, ``m``, ``n`` for "is not set")."""

    source: str
    value: str | None
    kernel_provided: bool
    error: str | None = None


def config_option(ctx: Context, option: str) -> list[ConfigValue]:
    """Every config source, in the order ais-check tries them plus ``/proc/config.gz`` first."""
    h = ctx.host
    rel = h.kernel_release() or ""
    out: list[ConfigValue] = []
    for path, gz, provided in (
        ("/proc/config.gz", True, True),
        (f"/boot/config-{rel}", False, False),
        (f"/lib/modules/{rel}/build/.config", False, False),
    ):
        if not rel and not provided:
            continue
        r = h.read(path, gz=gz)
        if r.text is None:
            out.append(ConfigValue(h.display(path), None, provided, r.error))
            continue
        out.append(ConfigValue(h.display(path), _config_value(r.text, option), provided))
    return out


def _config_value(text: str, option: str) -> str:
    m = re.search(rf"^{option}=(\S+)", text, re.M)
    if m:
        return m.group(1).strip('"')
    return "n"


@dataclass
class KernelLog:
    """The kernel ring buffer as text, or why it could not be read."""

    text: str | None
    source: str
    error: str | None = None
    wrapped: bool = False
    evidence: list[Evidence] = field(default_factory=list)


_TS = re.compile(r"^\[\s*(\d+)\.\d+\]")


def kernel_log(ctx: Context) -> KernelLog:
    """``dmesg``, else ``journalctl -k -b``. Flags a ring buffer that no longer starts at boot."""
    return ctx.memo("kernel_log", _kernel_log)


def _kernel_log(ctx: Context) -> KernelLog:
    tries: list[CommandResult] = []
    res = ctx.runner.run(["dmesg"], timeout=5)
    tries.append(res)
    if res.ok and res.stdout.strip():
        first = _TS.match(res.stdout.lstrip())
        wrapped = bool(first and int(first.group(1)) > 60)
        log = KernelLog(res.stdout, res.line, wrapped=wrapped)
        if not wrapped:
            return log
        jres = ctx.runner.run(["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager"], timeout=5)
        if jres.ok and jres.stdout.strip():
            log.text = res.stdout + "\n" + jres.stdout
            log.source = f"{res.line} + {jres.line}"
            log.wrapped = False
        return log
    jres = ctx.runner.run(["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager"], timeout=5)
    tries.append(jres)
    if jres.ok and jres.stdout.strip() and "No entries" not in jres.stdout:
        return KernelLog(jres.stdout, jres.line)
    reasons = [
        f"{t.argv[0]}: {t.error}" if t.error else t.first_error_line() or f"{t.argv[0]}: exit {t.returncode}"
        for t in tries
    ]
    return KernelLog(None, " / ".join(t.line for t in tries), "; ".join(reasons))
