"""The disk tier's namespaces that no running engine uses, its leftover temporary files and its quarantine.

Layout (docs/chunk-format.md): ``<long-path>/v1/<ns16>/namespace`` holds a namespace's name,
``<ns16>/<fan>/<key>.kvcache`` its chunks, ``.<name>.tmp`` files are writes in progress (or of a
writer that died), ``<long-path>/quarantine/`` holds files that failed verification. A namespace
whose model, weights or settings no engine runs with any more is dead weight until eviction reaches
it; new weights under the same model path (docs/namespace.md) leave one behind each time.

"In use" means declared by a client connected to the daemon that serves this directory (its STATS);
without that daemon the check cannot tell, and says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from infera.doctor.checks import plural
from infera.doctor.context import Context
from infera.doctor.facts.daemon import daemon as daemon_view
from infera.doctor.facts.daemon import engine_clients
from infera.doctor.facts.kvdconf import settings
from infera.doctor.model import CheckResult, Evidence, Status, skip, worst
from infera.doctor.registry import check
from infera.kvd import chunkfile as cf
from infera.units import format_size

MAX_FILES = 500_000  # stop counting past this many files (the sizes are then "at least")
STALE_TEMP_S = 60.0  # the daemon's own rule (infera.kvd.tiers.diskio.STALE_TEMP_S)


@dataclass
class NsDir:
    dirname: str
    name: str | None
    files: int = 0
    bytes: int = 0
    newest: float = 0.0


@dataclass
class TreeScan:
    namespaces: list[NsDir] = field(default_factory=list)
    temps: list[tuple[str, int, float]] = field(default_factory=list)
    quarantined: int = 0
    quarantined_bytes: int = 0
    truncated: bool = False
    errors: list[str] = field(default_factory=list)


def _scan(root: str) -> TreeScan:
    out = TreeScan()
    counted = 0

    def walk(d: str, ns: NsDir | None, depth: int) -> None:
        nonlocal counted
        try:
            entries = list(os.scandir(d))
        except OSError as exc:
            out.errors.append(f"{d}: {exc.strerror}")
            return
        for e in entries:
            if out.truncated:
                return
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.is_dir(follow_symlinks=False):
                if depth < 2:
                    walk(e.path, ns, depth + 1)
                continue
            if cf.is_temp_name(e.name):
                out.temps.append((e.path, st.st_size, st.st_mtime))
            elif ns is not None and e.name.endswith(cf.EXT):
                ns.files += 1
                ns.bytes += st.st_size
                ns.newest = max(ns.newest, st.st_mtime)
                counted += 1
                if counted >= MAX_FILES:
                    out.truncated = True

    vdir = os.path.join(root, cf.VERSION_DIR)
    try:
        names = sorted(
            n for n in os.listdir(vdir) if len(n) == 16 and all(c in "0123456789abcdef" for c in n)
        )
    except OSError:
        names = []
    for n in names:
        path = os.path.join(vdir, n)
        text = None
        try:
            with open(os.path.join(path, cf.NAMESPACE_FILE), errors="replace") as fh:
                text = fh.read(4096).strip() or None
        except OSError:
            pass
        ns = NsDir(n, text)
        out.namespaces.append(ns)
        walk(path, ns, 0)
    qdir = os.path.join(root, cf.QUARANTINE_DIR)
    try:
        for e in os.scandir(qdir):
            if e.is_file(follow_symlinks=False):
                out.quarantined += 1
                out.quarantined_bytes += e.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return out


def _long_path(ctx: Context) -> tuple[str | None, str]:
    if ctx.options.long_path:
        return ctx.options.long_path, "--long-path"
    stats = daemon_view(ctx).stats or {}
    long = (stats.get("tiers") or {}).get("long") or {}
    if long.get("path"):
        return str(long["path"]), "the daemon's STATS"
    s = settings(ctx)
    if s.get("long_path"):
        return str(s.get("long_path")), s.where("long_path")
    return None, ""


def _age(t: float, now: float) -> str:
    days = (now - t) / 86400
    return f"{days:.0f} days ago" if days >= 1 else f"{(now - t) / 3600:.1f} h ago"


@check(
    "disk-namespaces", "disk-tier namespaces no engine uses, leftover temporary files", "storage", order=20
)
def disk_namespaces(ctx: Context) -> CheckResult:
    root, origin = _long_path(ctx)
    if not root:
        return skip("no disk tier to look at (no --long-path, no daemon with one)")
    real = str(ctx.host.path(root))
    if not os.path.isdir(real):
        return skip(f"{root} ({origin}) does not exist yet")
    scan = _scan(real)
    now = time.time()
    view = daemon_view(ctx)
    stats = view.stats or {}
    serving = os.path.abspath(
        str(((stats.get("tiers") or {}).get("long") or {}).get("path") or "")
    ) == os.path.abspath(root)
    in_use = (
        {str(c.get("namespace")) for c in engine_clients(stats) if c.get("namespace")} if serving else None
    )
    ev = [
        Evidence(
            ctx.host.display(root),
            f"disk tier ({origin}): {plural(len(scan.namespaces), 'namespace')}",
            "file",
        )
    ]
    for ns in scan.namespaces:
        used = "" if in_use is None else (" (in use)" if ns.name in in_use else " (no connected engine)")
        ev.append(
            Evidence(
                ctx.host.display(f"{root}/{cf.VERSION_DIR}/{ns.dirname}"),
                f"{ns.name or '(no namespace file)'}: {ns.files} files, {format_size(ns.bytes)}"
                + (f", last write {_age(ns.newest, now)}" if ns.newest else "")
                + used,
            )
        )
    findings: list[tuple[Status, str, str]] = []
    stale = [t for t in scan.temps if not serving or now - t[2] >= STALE_TEMP_S]
    if stale:
        size = sum(t[1] for t in stale)
        findings.append(
            (
                Status.WARN,
                f"{plural(len(stale), 'leftover temporary file')} ({format_size(size)}) of writers that died",
                f"the daemon removes them at its next start; or, with the daemon stopped, "
                f"find {root} -name '.*{cf.TMP_SUFFIX}' -delete",
            )
        )
    if scan.quarantined:
        findings.append(
            (
                Status.WARN,
                f"{plural(scan.quarantined, 'corrupt chunk file')} in quarantine ({format_size(scan.quarantined_bytes)}, reclaimable)",
                f"look at one (kvd doctor does not), then rm -r {root}/{cf.QUARANTINE_DIR}",
            )
        )
    details = []
    if scan.truncated:
        details.append(f"stopped counting after {MAX_FILES} files: sizes are lower bounds")
    if in_use is not None:
        unused = [ns for ns in scan.namespaces if ns.name not in in_use and ns.files]
        if unused:
            size = sum(ns.bytes for ns in unused)
            names = ", ".join(f"{ns.name or ns.dirname} ({format_size(ns.bytes)})" for ns in unused[:4])
            findings.append(
                (
                    Status.WARN,
                    f"{plural(len(unused), 'namespace')} no connected engine uses hold {format_size(size)}: {names}"
                    + (f" and {len(unused) - 4} more" if len(unused) > 4 else ""),
                    "if no engine will run them again, stop the daemon and remove their directories ("
                    + " ".join(f"{root}/{cf.VERSION_DIR}/{ns.dirname}" for ns in unused[:4])
                    + "); the daemon rebuilds its index at start, and eviction reclaims them anyway when the tier fills",
                )
            )
    elif len(scan.namespaces) > 1:
        why = view.error or "it serves another directory"
        total = sum(ns.bytes for ns in scan.namespaces)
        return CheckResult(
            Status.UNKNOWN if not findings else worst(f[0] for f in findings),
            f"{plural(len(scan.namespaces), 'namespace')} ({format_size(total)}) on disk; which ones running engines use "
            f"needs the daemon that serves {root} ({why})"
            + ("; " + "; ".join(f[1] for f in findings) if findings else ""),
            ev,
            fix="; ".join(f[2] for f in findings)
            or "rerun with --socket of the daemon that serves this --long-path",
            details=details,
        )
    if findings:
        return CheckResult(
            worst(f[0] for f in findings),
            "; ".join(f[1] for f in findings),
            ev,
            fix="; ".join(f[2] for f in findings),
            details=details,
        )
    total = sum(ns.bytes for ns in scan.namespaces)
    return CheckResult(
        Status.OK,
        f"{plural(len(scan.namespaces), 'namespace')} ({format_size(total)})"
        + (", all used by connected engines" if in_use is not None and scan.namespaces else "")
        + ", no leftover temporary files",
        ev,
        details=details,
    )
