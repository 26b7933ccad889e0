"""The syntax of a systemd unit file, checked the way systemd reads it (KVD000).

systemd's unit parser (``config_parse`` in src/shared/conf-parser.c) skips blank lines and lines that
start with ``#`` or ``;``, joins backslash continuations, and then reads each line as a ``[Section]``
header or a ``Key=value`` assignment. What it does with the rest decides the severity here:

* a header without its closing ``]``: systemd refuses the whole file (error);
* a line without ``=``, or with nothing before it: ignored by current systemd, fatal to older ones
  (error: the line certainly does not do what it says);
* an unknown section: ignored with every key in it (error: ``[Servce]`` loses the whole service);
  ``X-`` sections are the documented way to add one of your own, and the sections of other unit types
  (``[Socket]``, ``[Timer]``, ...) are known;
* an assignment before the first section: ignored (warning);
* an unknown key in ``[Unit]``, ``[Service]`` or ``[Install]``: ignored (warning). systemd has hundreds
  of keys and adds more with each release, so only a key that is certainly wrong is reported: one in
  the wrong case, one that is not a ``CamelCase`` name, or one a letter or two away from a key below;
* a ``.service`` file with no ``ExecStart=`` (nor ``ExecStop=``/``SuccessAction=``): systemd refuses
  to start it (error). Drop-ins (``*.conf``) are not held to this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infera.launch.lint.units import logical_lines


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


SECTIONS = frozenset(
    ("Unit", "Install", "Service", "Socket", "Timer", "Mount", "Automount", "Swap", "Path", "Slice", "Scope")
)
#: Keys of the sections ``kvd launch`` writes (templates/*.service.j2), and the common ones users add.
KEYS = {
    "Unit": _names(
        "Description Documentation Wants Requires Requisite BindsTo PartOf Upholds Conflicts Before After "
        "OnFailure OnSuccess PropagatesReloadTo ReloadPropagatedFrom PropagatesStopTo StopPropagatedFrom "
        "JoinsNamespaceOf RequiresMountsFor WantsMountsFor OnFailureJobMode IgnoreOnIsolate StopWhenUnneeded "
        "RefuseManualStart RefuseManualStop AllowIsolate DefaultDependencies CollectMode FailureAction "
        "SuccessAction FailureActionExitStatus SuccessActionExitStatus JobTimeoutSec JobRunningTimeoutSec "
        "JobTimeoutAction StartLimitIntervalSec StartLimitBurst StartLimitAction RebootArgument "
        "SourcePath BindTo PropagateReloadTo PropagateReloadFrom"
    ),
    "Install": _names("Alias WantedBy RequiredBy UpheldBy Also DefaultInstance"),
    "Service": _names(
        # systemd.service
        "Type ExitType RemainAfterExit GuessMainPID PIDFile BusName ExecStart ExecStartPre ExecStartPost "
        "ExecCondition ExecReload ExecStop ExecStopPost RestartSec RestartSteps RestartMaxDelaySec "
        "TimeoutStartSec TimeoutStopSec TimeoutAbortSec TimeoutSec RuntimeMaxSec WatchdogSec Restart "
        "RestartMode SuccessExitStatus RestartPreventExitStatus RestartForceExitStatus NotifyAccess "
        "Sockets FileDescriptorStoreMax OOMPolicy OpenFile ReloadSignal "
        # systemd.exec
        "WorkingDirectory RootDirectory User Group DynamicUser SupplementaryGroups PAMName Environment "
        "EnvironmentFile PassEnvironment UnsetEnvironment StandardInput StandardOutput StandardError "
        "SyslogIdentifier SyslogFacility SyslogLevel LogLevelMax UMask Nice CPUSchedulingPolicy "
        "CPUSchedulingPriority CPUAffinity NUMAPolicy NUMAMask IOSchedulingClass IOSchedulingPriority "
        "OOMScoreAdjust CapabilityBoundingSet AmbientCapabilities NoNewPrivileges SecureBits ProtectSystem "
        "ProtectHome PrivateTmp PrivateDevices PrivateNetwork PrivateUsers PrivateMounts ProtectKernelTunables "
        "ProtectKernelModules ProtectKernelLogs ProtectControlGroups ProtectClock ProtectHostname "
        "RestrictNamespaces RestrictRealtime RestrictSUIDSGID LockPersonality MemoryDenyWriteExecute "
        "SystemCallFilter SystemCallArchitectures ReadWritePaths ReadOnlyPaths InaccessiblePaths BindPaths "
        "BindReadOnlyPaths RuntimeDirectory StateDirectory CacheDirectory LogsDirectory "
        "ConfigurationDirectory RuntimeDirectoryMode RuntimeDirectoryPreserve LoadCredential SetCredential "
        # systemd.kill and systemd.resource-control
        "KillMode KillSignal SendSIGKILL SendSIGHUP FinalKillSignal Slice Delegate CPUAccounting CPUWeight "
        "CPUQuota AllowedCPUs AllowedMemoryNodes MemoryAccounting MemoryMin MemoryLow MemoryHigh MemoryMax "
        "MemorySwapMax TasksAccounting TasksMax IOAccounting IOWeight DeviceAllow DevicePolicy IPAccounting "
        "IPAddressAllow IPAddressDeny "
        # the resource limits
        "LimitCPU LimitFSIZE LimitDATA LimitSTACK LimitCORE LimitRSS LimitNOFILE LimitAS LimitNPROC "
        "LimitMEMLOCK LimitLOCKS LimitSIGPENDING LimitMSGQUEUE LimitNICE LimitRTPRIO LimitRTTIME"
    ),
}
#: [Unit] keys that are families: ConditionPathExists=, AssertHost=, ...
_KEY_PREFIXES = {"Unit": ("Condition", "Assert")}
_NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


@dataclass(frozen=True)
class UnitProblem:
    line: int
    col: int
    message: str
    error: bool = True
    fatal: bool = False  # systemd refuses the whole file: nothing in it takes effect


def check_unit(text: str, name: str) -> list[UnitProblem]:
    """Syntax problems in a unit file, in file order; ``name`` is its file name (``*.service`` must start
    something)."""
    out: list[UnitProblem] = []
    section: str | None = None  # None: before the first header, or in a section systemd ignores
    seen_section = False
    service_at: tuple[int, int] | None = None
    starts = False
    for line_text, pos in logical_lines(text):
        s = line_text.strip()
        line, col = pos[len(line_text) - len(line_text.lstrip())]
        if s.startswith("["):
            seen_section, section = True, None
            if not s.endswith("]"):
                out.append(
                    UnitProblem(
                        line,
                        col,
                        f"section header {s!r} has no closing ']': systemd refuses the file",
                        fatal=True,
                    )
                )
            elif s[1:-1] in SECTIONS or s.startswith("[X-"):
                section = s[1:-1]
                service_at = service_at or ((line, col) if section == "Service" else None)
            else:
                near = _did_you_mean(s[1:-1], SECTIONS, "[{}]")
                out.append(
                    UnitProblem(
                        line, col, f"unknown section {s}{near}: systemd ignores it and every key in it"
                    )
                )
            continue
        key, eq, _ = s.partition("=")
        key = key.strip()
        if not eq or not key:
            what = "has no '='" if not eq else "has no key before '='"
            out.append(UnitProblem(line, col, f"line {what}: systemd expects Key=value and ignores it"))
        elif not seen_section:
            out.append(
                UnitProblem(
                    line, col, f"{key}= comes before the first [Section]: systemd ignores it", error=False
                )
            )
        elif section is not None:
            starts = starts or key in ("ExecStart", "ExecStop", "SuccessAction")
            why = _unknown_key(section, key)
            if why:
                out.append(UnitProblem(line, col, f"{why}: systemd ignores it", error=False))
    if name.endswith((".service", ".service.in")) and not starts and not any(p.fatal for p in out):
        line, col = service_at or (1, 1)
        out.append(
            UnitProblem(line, col, "no ExecStart= in [Service]: systemd refuses to start this service")
        )
    return out


def _unknown_key(section: str, key: str) -> str:
    """Why ``key`` is certainly not a key of ``section``, or ""."""
    known = KEYS.get(section)
    if (
        known is None
        or key in known
        or key.startswith("X-")
        or key.startswith(_KEY_PREFIXES.get(section, ()))
    ):
        return ""
    same_case = [k for k in known if k.lower() == key.lower()]
    if same_case:
        return f"unknown key {key}= in [{section}] (keys are case-sensitive: {same_case[0]}=)"
    near = _did_you_mean(key, known, "{}=")
    if near:
        return f"unknown key {key}= in [{section}]{near}"
    if not _NAME_RE.match(key):
        return f"unknown key {key}= in [{section}] (systemd keys are CamelCase letters and digits)"
    return ""


def _did_you_mean(word: str, known: frozenset[str], shape: str) -> str:
    """`` (did you mean X?)`` for the known word one edit from ``word``, or two for a long one."""
    limit = 1 if len(word) < 6 else 2
    best = min(known, key=lambda k: (_distance(word, k), k))
    return f" (did you mean {shape.format(best)}?)" if _distance(word, best) <= limit else ""


def _distance(a: str, b: str) -> int:
    """Edit distance, a swap of two neighbours counting as one edit (optimal string alignment)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]
