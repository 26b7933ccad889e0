"""Are we in a container (or a VM)? Several signals, each shown, none trusted alone.

No single file is reliable: ``/.dockerenv`` can be baked into an image, podman does not create it,
containerd creates nothing, and cgroup v2 hides the cgroup path. Strong signals (runtime marker
files, PID 1's ``container=``, a container cgroup path, a private cgroup namespace, Kubernetes
service-account token) decide; weak ones alone make it "possibly a container". Either way the
checks that read host-only files (``/boot``, ``/lib/modules``, DKMS) say unknown rather than trust
the image's copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infera.doctor.context import Context
from infera.doctor.model import Evidence

INIT_CGROUP_NS = "cgroup:[4026531835]"
_CGROUP_RUNTIMES = (
    ("kubepods", "kubernetes"),
    ("libpod", "podman"),
    ("docker", "docker"),
    ("crio", "cri-o"),
    ("containerd", "containerd"),
    ("lxc", "lxc"),
)
_VM_VENDORS = (
    "qemu",
    "kvm",
    "vmware",
    "virtualbox",
    "xen",
    "amazon ec2",
    "google",
    "microsoft",
    "firecracker",
)


@dataclass
class Signal:
    name: str
    value: str
    strong: bool
    source: str

    def evidence(self) -> Evidence:
        tag = "strong" if self.strong else "weak"
        return Evidence(self.source, f"{self.value} ({tag} signal: {self.name})", "signal")


@dataclass
class ContainerInfo:
    signals: list[Signal] = field(default_factory=list)
    vm: list[Signal] = field(default_factory=list)
    notes: list[Evidence] = field(default_factory=list)
    runtime: str | None = None
    looked_at: int = 0  # how many of the process files the signals come from could be read

    @property
    def strong(self) -> bool:
        return any(s.strong for s in self.signals)

    @property
    def in_container(self) -> bool:
        """True on any signal: host-only checks then say unknown rather than read the image's files."""
        return bool(self.signals)

    @property
    def verdict(self) -> str:
        if not self.signals:
            return "host"
        return "container" if self.strong else "possibly a container"

    def describe(self) -> str:
        """Short reason for other checks' "unknown" summaries."""
        names = ", ".join(s.name for s in self.signals[:3])
        rt = f" ({self.runtime})" if self.runtime else ""
        return f"{self.verdict}{rt}: {names}"

    def evidence(self) -> list[Evidence]:
        return [s.evidence() for s in self.signals + self.vm] + self.notes


def detect(ctx: Context) -> ContainerInfo:
    return ctx.memo("container", _detect)


def _detect(ctx: Context) -> ContainerInfo:
    h = ctx.host
    info = ContainerInfo()
    runtimes: list[str] = []

    def add(name: str, value: str, strong: bool, source: str, runtime: str | None = None) -> None:
        info.signals.append(Signal(name, value, strong, source))
        if runtime:
            runtimes.append(runtime)

    for path, label in (
        ("/run/host/container-manager", "container manager file"),
        ("/run/systemd/container", "systemd container file"),
    ):
        val = h.value(path)
        if val:
            add(label, val, True, h.display(path), val)
    if h.exists("/run/.containerenv"):
        add("/run/.containerenv exists", "present", True, h.display("/run/.containerenv"), "podman")

    env1 = h.read("/proc/1/environ")
    info.looked_at += env1.text is not None
    if env1.text is not None:
        for item in env1.text.split("\0"):
            if item.startswith("container="):
                val = item.split("=", 1)[1]
                add("container= in PID 1 environment", val, True, h.display("/proc/1/environ"), val)
    elif env1.error and env1.error != "missing":
        info.notes.append(Evidence(h.display("/proc/1/environ"), f"not readable ({env1.error})", "file"))
    own = ctx.environ.get("container")
    if own:
        add("container= in this process's environment", own, True, "env container", own)

    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    if h.exists(token):
        add("Kubernetes service-account token", "present", True, h.display(token), "kubernetes")
    if ctx.environ.get("KUBERNETES_SERVICE_HOST"):
        add("KUBERNETES_SERVICE_HOST set", ctx.environ["KUBERNETES_SERVICE_HOST"], False, "env", "kubernetes")

    cg = h.read("/proc/1/cgroup")
    info.looked_at += cg.text is not None
    if cg.text:
        for needle, runtime in _CGROUP_RUNTIMES:
            if needle in cg.text:
                line = next(ln for ln in cg.text.splitlines() if needle in ln)
                add(
                    "container cgroup path of PID 1", line.strip(), True, h.display("/proc/1/cgroup"), runtime
                )
                break

    ns = h.readlink("/proc/self/ns/cgroup")
    if ns and ns != INIT_CGROUP_NS and ns.startswith("cgroup:"):
        add("private cgroup namespace", ns, True, h.display("/proc/self/ns/cgroup"))
    elif ns:
        info.notes.append(
            Evidence(h.display("/proc/self/ns/cgroup"), f"{ns} (the initial namespace)", "file")
        )

    if h.exists("/.dockerenv"):
        add("/.dockerenv exists", "present", False, h.display("/.dockerenv"), "docker")

    mountinfo = h.text("/proc/self/mountinfo")
    info.looked_at += mountinfo is not None
    root_fs = _root_fstype(mountinfo or "")
    if root_fs == "overlay":
        add("root filesystem is overlay", "overlay", False, h.display("/proc/self/mountinfo"))
    elif root_fs:
        info.notes.append(
            Evidence(h.display("/proc/self/mountinfo"), f"root filesystem is {root_fs}", "file")
        )

    cmdline1 = h.text("/proc/1/cmdline")
    info.looked_at += cmdline1 is not None
    cmd1 = (cmdline1 or "").split("\0")[0]
    if cmd1:
        base = cmd1.rsplit("/", 1)[-1]
        if base not in ("systemd", "init", "launchd", "runit", "openrc-init", "s6-svscan"):
            add("PID 1 is not an init system", cmd1, False, h.display("/proc/1/cmdline"))

    if ctx.live:
        res = ctx.runner.run(["systemd-detect-virt", "--container"], timeout=3)
        if res.ran and res.stdout.strip() and res.stdout.strip() != "none":
            info.notes.append(Evidence(res.line, res.stdout.strip(), "command"))
        vres = ctx.runner.run(["systemd-detect-virt", "--vm"], timeout=3)
        if vres.ran and vres.stdout.strip() and vres.stdout.strip() != "none":
            info.vm.append(Signal("systemd-detect-virt --vm", vres.stdout.strip(), True, vres.line))

    cpuinfo = h.text("/proc/cpuinfo") or ""
    if re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M):
        info.vm.append(Signal("hypervisor CPU flag", "set", True, h.display("/proc/cpuinfo")))
    for attr in ("sys_vendor", "product_name"):
        val = h.value(f"/sys/class/dmi/id/{attr}")
        if val and any(v in val.lower() for v in _VM_VENDORS):
            info.vm.append(Signal(f"DMI {attr}", val, True, h.display(f"/sys/class/dmi/id/{attr}")))

    info.runtime = runtimes[0] if runtimes else None
    return info


def _root_fstype(mountinfo: str) -> str | None:
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[4] == "/" and " - " in line:
            return line.split(" - ", 1)[1].split()[0]
    return None
