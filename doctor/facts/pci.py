"""GPUs on the PCI bus (sysfs) and the KFD topology.

Read from ``/sys/bus/pci/devices``, which exists on hosts, in VMs and in containers alike, so the
GPU list does not depend on ROCm or CUDA tools being installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infera.doctor.context import Context
from infera.doctor.model import Evidence

AMD = "0x1002"
NVIDIA = "0x10de"
PCI_DEVICES = "/sys/bus/pci/devices"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
#: Display controllers (0x03xxxx) and processing accelerators (0x12xxxx).
GPU_CLASSES = ("0x03", "0x12")

#: Device ids worth naming (pci.ids); the VF and APU ids decide checks, the rest only label.
AMD_NAMES: dict[str, str] = {
    "0x74a1": "Instinct MI300X",
    "0x74a5": "Instinct MI325X",
    "0x74a0": "Instinct MI300A",
    "0x74b5": "Instinct MI300X VF",
    "0x74b9": "Instinct MI325X VF",
    "0x740c": "Instinct MI250X/MI250",
    "0x740f": "Instinct MI210",
}
AMD_VF_IDS = {"0x74b5", "0x74b9"}
AMD_APU_IDS = {"0x74a0"}
NVIDIA_NAMES: dict[str, str] = {
    "0x2330": "H100 SXM5 80GB",
    "0x2331": "H100 PCIe",
    "0x2335": "H200",
    "0x20b0": "A100 SXM4 40GB",
    "0x20b2": "A100 SXM4 80GB",
}


@dataclass
class Gpu:
    bdf: str
    vendor: str
    device: str
    pci_class: str
    driver: str | None
    sysfs: str
    is_vf: bool = False
    vf_reason: str | None = None
    sriov_totalvfs: int | None = None
    vram_total: int | None = None
    vis_vram_total: int | None = None
    bar0_size: int | None = None
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def name(self) -> str:
        table = AMD_NAMES if self.vendor == AMD else NVIDIA_NAMES if self.vendor == NVIDIA else {}
        known = table.get(self.device)
        vendor = "AMD" if self.vendor == AMD else "NVIDIA" if self.vendor == NVIDIA else self.vendor
        return f"{vendor} {known}" if known else f"{vendor} device {self.device}"

    @property
    def is_apu(self) -> bool:
        return self.vendor == AMD and self.device in AMD_APU_IDS


@dataclass
class GpuInventory:
    amd: list[Gpu]
    nvidia: list[Gpu]
    scanned: int
    error: str | None = None

    @property
    def any(self) -> bool:
        return bool(self.amd or self.nvidia)

    def describe(self) -> str:
        if self.error:
            return f"PCI devices not readable ({self.error})"
        return f"{len(self.amd)} AMD and {len(self.nvidia)} NVIDIA GPUs among {self.scanned} PCI devices"


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text else None
    except ValueError:
        return None


def bar0_size(resource: str | None) -> int | None:
    """Size of BAR0 from a sysfs ``resource`` file (``start end flags`` per line, hex)."""
    if not resource:
        return None
    first = resource.splitlines()[0].split()
    if len(first) < 2:
        return None
    start, end = int(first[0], 16), int(first[1], 16)
    return end - start + 1 if end > start else None


def inventory(ctx: Context) -> GpuInventory:
    return ctx.memo("gpus", _inventory)


def _inventory(ctx: Context) -> GpuInventory:
    h = ctx.host
    if not h.is_dir(PCI_DEVICES):
        return GpuInventory([], [], 0, "missing" if not h.exists(PCI_DEVICES) else "not a directory")
    amd: list[Gpu] = []
    nvidia: list[Gpu] = []
    names = h.listdir(PCI_DEVICES)
    for bdf in names:
        d = f"{PCI_DEVICES}/{bdf}"
        vendor = (h.value(f"{d}/vendor") or "").lower()
        cls = (h.value(f"{d}/class") or "").lower()
        if vendor not in (AMD, NVIDIA) or not cls.startswith(GPU_CLASSES):
            continue
        device = (h.value(f"{d}/device") or "").lower()
        drv_link = h.readlink(f"{d}/driver")
        gpu = Gpu(bdf, vendor, device, cls, drv_link.rsplit("/", 1)[-1] if drv_link else None, d)
        gpu.evidence.append(Evidence(h.display(d), f"vendor {vendor} device {device} class {cls}", "file"))
        if h.exists(f"{d}/physfn"):
            gpu.is_vf = True
            gpu.vf_reason = f"physfn link -> {h.readlink(f'{d}/physfn')}"
        elif vendor == AMD and device in AMD_VF_IDS:
            gpu.is_vf = True
            gpu.vf_reason = f"device id {device}"
        gpu.sriov_totalvfs = _int(h.value(f"{d}/sriov_totalvfs"))
        gpu.vram_total = _int(h.value(f"{d}/mem_info_vram_total"))
        gpu.vis_vram_total = _int(h.value(f"{d}/mem_info_vis_vram_total"))
        gpu.bar0_size = bar0_size(h.text(f"{d}/resource"))
        (amd if vendor == AMD else nvidia).append(gpu)
    return GpuInventory(amd, nvidia, len(names))


@dataclass
class KfdNode:
    node: str
    props: dict[str, int]

    @property
    def is_gpu(self) -> bool:
        return self.props.get("simd_count", 0) != 0

    @property
    def capability(self) -> int | None:
        return self.props.get("capability")

    @property
    def gfx(self) -> str | None:
        v = self.props.get("gfx_target_version")
        if not v:
            return None
        major, minor, step = v // 10000, v // 100 % 100, v % 100
        return f"gfx{major}{minor:x}{step:x}"


def parse_kfd_properties(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def kfd_nodes(ctx: Context) -> list[KfdNode] | None:
    """KFD topology nodes, or None when there is no KFD (no amdgpu, or /sys/class/kfd not visible)."""

    def read(c: Context) -> list[KfdNode] | None:
        if not c.host.is_dir(KFD_NODES):
            return None
        nodes = []
        for n in c.host.listdir(KFD_NODES):
            text = c.host.text(f"{KFD_NODES}/{n}/properties")
            if text is not None:
                nodes.append(KfdNode(n, parse_kfd_properties(text)))
        return sorted(nodes, key=lambda k: int(k.node) if k.node.isdigit() else 0)

    return ctx.memo("kfd", read)
