"""From the host script's raw JSON to a :class:`~cleanslate.doctor.report.HostDoctor`: a pure
function (no host, no clock), tested on real captures and edited copies of them.

Devices are read from NVML first and from ``nvidia-smi -q`` for what NVML did not give; pairs
from ``topo -m`` (the link) and NVML P2P status (``topo -p2p`` otherwise); the environment from
the probes of :mod:`cleanslate.doctor._doctor_script` (systemd-logind's files through
:mod:`cleanslate.doctor.logind`). :mod:`cleanslate.doctor.findings` judges.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from cleanslate.doctor.findings import CONTAINER_WORDS, judge
from cleanslate.doctor.logind import logind_ipc
from cleanslate.doctor.parse import (
    SmiGpu,
    SmiParseError,
    SmiValue,
    TopoMatrix,
    parse_p2p_matrix,
    parse_smi_q,
    parse_topo_matrix,
    smi_bool,
    smi_float,
    smi_int,
)
from cleanslate.doctor.report import (
    Device,
    DoctorFinding,
    DoctorSeverity,
    Driver,
    Environment,
    HostDoctor,
    Pair,
)

#: NVML's P2P status values, as ``topo -p2p`` spells them.
NVML_P2P = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DISABLED", 5: "NS", 6: "U"}
#: NVML's common-ancestor levels, as ``topo -m`` spells them.
NVML_ANCESTOR = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: NVML clock-event (throttle) reason bits, by the name ``nvidia-smi -q`` prints.
CLOCK_REASONS = {
    0x1: "Idle",
    0x2: "Applications Clocks Setting",
    0x4: "SW Power Cap",
    0x8: "HW Slowdown",
    0x10: "Sync Boost",
    0x20: "SW Thermal Slowdown",
    0x40: "HW Thermal Slowdown",
    0x80: "HW Power Brake Slowdown",
    0x100: "Display Clock Setting",
}
_DMI_VMS = ("QEMU", "KVM", "VMware", "VirtualBox", "Xen", "Microsoft Corporation",
            "Amazon EC2", "Google", "Firecracker", "OpenStack", "Bochs", "Parallels")


def _is_error(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("ERR ")


def _why(value: Any) -> str:
    """``"ERR NVMLError_NotSupported: Not Supported"`` -> ``"Not Supported"``."""
    text = str(value)
    return text.split(": ", 1)[1] if ": " in text else text


def _ints(value: Any) -> list[int] | None:
    """A list of ints from a list or a tuple printed as text (``"(0, 0, 0, 0)"``)."""
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    if isinstance(value, str) and not _is_error(value):
        found = re.findall(r"-?\d+", value)
        return [int(x) for x in found] if found else None
    return None


def _affinity(words: list[int]) -> str:
    """NVML's CPU affinity bitmask (64-bit words, lowest CPUs first) as CPU ranges ``0-15``."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
    ranges: list[str] = []
    for cpu in cpus:
        if ranges and "-" in ranges[-1] and int(ranges[-1].split("-")[1]) == cpu - 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        elif ranges and "-" not in ranges[-1] and int(ranges[-1]) == cpu - 1:
            ranges[-1] = f"{ranges[-1]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)


class _DeviceBuilder:
    """Collects one GPU's fields with where each came from and why a field was not read."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.not_read: dict[str, str] = {}

    def nvml(self, name: str, value: Any, raw_name: str, raw: Any) -> None:
        if value is None:
            if name not in self.not_read:
                self.not_read[name] = f"nvml {raw_name}: {_why(raw)}"
            return
        self.values[name] = value
        self.sources[name] = f"nvml {raw_name}={raw}"
        self.not_read.pop(name, None)

    def smi(self, name: str, value: Any, gpu: SmiGpu, path: str) -> None:
        if name in self.values:
            return
        field = gpu.get(path)
        if value is None:
            if field is not None:
                self.not_read.setdefault(name, f"nvidia-smi -q {path} : {field.value}")
            return
        self.values[name] = value
        self.sources[name] = f"nvidia-smi -q GPU {gpu.bus_id}: {path} : " + (
            field.value if field is not None else "")
        self.not_read.pop(name, None)

    def build(self) -> Device:
        return Device(index=self.index, sources=self.sources, not_read=self.not_read,
                      **self.values)


def _nvml_device(b: _DeviceBuilder, g: Mapping[str, Any]) -> None:
    def plain(key: str, name: str | None = None) -> None:
        raw = g.get(key)
        ok = raw is not None and not _is_error(raw)
        b.nvml(name or key, raw if ok else None, key, raw)

    plain("name")
    plain("uuid")
    plain("pci", "pci_bus_id")
    for key in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"):
        plain(key)
    plain("pcie_replay", "pcie_replays")
    raw = g.get("temp")
    b.nvml("temperature_c", raw if isinstance(raw, int) else None, "temp", raw)
    raw = g.get("persistence")
    b.nvml("persistence", bool(raw) if isinstance(raw, int) else None, "persistence", raw)
    for key in ("mig", "ecc"):
        raw = g.get(key)
        pair = _ints(raw)
        b.nvml(key, bool(pair[0]) if pair else None, key, raw)
    raw = g.get("ecc_uncorrected_volatile")
    b.nvml("ecc_uncorrected_volatile", raw if isinstance(raw, int) else None,
           "ecc_uncorrected_volatile", raw)
    raw = g.get("retired_pending")
    b.nvml("retired_pages_pending", bool(raw) if isinstance(raw, int) else None,
           "retired_pending", raw)
    raw = g.get("remapped")
    rows = _ints(raw)
    if rows and len(rows) >= 4:
        b.nvml("remapped_rows_pending", bool(rows[2]), "remapped", raw)
        b.nvml("remapped_rows_failure", bool(rows[3]), "remapped", raw)
    else:
        b.nvml("remapped_rows_pending", None, "remapped", raw)
        b.nvml("remapped_rows_failure", None, "remapped", raw)
    raw = g.get("throttle")
    reasons = (tuple(name for bit, name in CLOCK_REASONS.items() if raw & bit)
               if isinstance(raw, int) else None)
    b.nvml("clock_event_reasons", reasons, "throttle", raw)
    for key, name in (("power_limit", "power_limit_w"), ("power_default", "power_default_w")):
        raw = g.get(key)
        b.nvml(name, raw / 1000 if isinstance(raw, int) else None, key, raw)
    raw = g.get("numa")
    b.nvml("numa_node", str(raw) if isinstance(raw, int) else None, "numa", raw)
    raw = g.get("cpu_affinity")
    words = _ints(raw)
    b.nvml("cpu_affinity", _affinity(words) if words else None, "cpu_affinity", raw)
    links = g.get("nvlink")
    if isinstance(links, list) and links:
        states = [x for x in links if isinstance(x, int)]
        if states:
            b.nvml("nvlink_up", sum(1 for x in states if x), "nvlink",
                   f"{sum(1 for x in states if x)} of {len(links)} links up")
        else:
            b.nvml("nvlink_up", None, "nvlink", links[0])


def _smi_device(b: _DeviceBuilder, gpu: SmiGpu) -> None:
    def text(name: str, path: str) -> None:
        field = gpu.get(path)
        value = field.value if field and field.value not in ("N/A", "[N/A]") else None
        b.smi(name, value, gpu, path)

    text("name", "Product Name")
    text("uuid", "GPU UUID")
    text("pci_bus_id", "PCI/Bus Id")
    b.smi("persistence", smi_bool(gpu.get("Persistence Mode")), gpu, "Persistence Mode")
    b.smi("mig", smi_bool(gpu.get("MIG Mode/Current")), gpu, "MIG Mode/Current")
    b.smi("ecc", smi_bool(gpu.get("ECC Mode/Current")), gpu, "ECC Mode/Current")
    dram = smi_int(gpu.get("ECC Errors/Volatile/DRAM Uncorrectable"))
    sram = smi_int(gpu.get("ECC Errors/Volatile/SRAM Uncorrectable SEC-DED"))
    total = None if dram is None and sram is None else (dram or 0) + (sram or 0)
    b.smi("ecc_uncorrected_volatile", total, gpu, "ECC Errors/Volatile/DRAM Uncorrectable")
    b.smi("retired_pages_pending", smi_bool(gpu.get("Retired Pages/Pending Page Blacklist")),
          gpu, "Retired Pages/Pending Page Blacklist")
    b.smi("remapped_rows_pending", smi_bool(gpu.get("Remapped Rows/Pending")), gpu,
          "Remapped Rows/Pending")
    b.smi("remapped_rows_failure",
          smi_bool(gpu.get("Remapped Rows/Remapping Failure Occurred")), gpu,
          "Remapped Rows/Remapping Failure Occurred")
    reasons = [(path.split("/")[-1], v) for path, v in gpu.fields.items()
               if path.startswith("Clocks Event Reasons/")
               or path.startswith("Clocks Throttle Reasons/")]
    if reasons:
        active = tuple(name for name, v in reasons if v.value == "Active")
        b.smi("clock_event_reasons", active, gpu, "Clocks Event Reasons")
        if "clock_event_reasons" in b.sources and b.sources[
                "clock_event_reasons"].startswith("nvidia-smi"):
            b.sources["clock_event_reasons"] = (
                f"nvidia-smi -q GPU {gpu.bus_id}: Clocks Event Reasons active: "
                + (", ".join(active) or "none"))
    b.smi("power_limit_w", smi_float(gpu.get("GPU Power Readings/Current Power Limit")), gpu,
          "GPU Power Readings/Current Power Limit")
    b.smi("power_default_w", smi_float(gpu.get("GPU Power Readings/Default Power Limit")), gpu,
          "GPU Power Readings/Default Power Limit")
    b.smi("temperature_c", smi_int(gpu.get("Temperature/GPU Current Temp")), gpu,
          "Temperature/GPU Current Temp")
    link = "PCI/GPU Link Info/"
    b.smi("pcie_gen", smi_int(gpu.get(link + "PCIe Generation/Current")), gpu,
          link + "PCIe Generation/Current")
    b.smi("pcie_gen_max", smi_int(gpu.get(link + "PCIe Generation/Max")), gpu,
          link + "PCIe Generation/Max")
    b.smi("pcie_width", smi_int(gpu.get(link + "Link Width/Current")), gpu,
          link + "Link Width/Current")
    b.smi("pcie_width_max", smi_int(gpu.get(link + "Link Width/Max")), gpu,
          link + "Link Width/Max")
    b.smi("pcie_replays", smi_int(gpu.get("PCI/Replays Since Reset")), gpu,
          "PCI/Replays Since Reset")


def _command_text(commands: Mapping[str, Any], name: str) -> str | None:
    cmd = commands.get(name)
    if isinstance(cmd, Mapping) and cmd.get("rc") == 0 and isinstance(cmd.get("stdout"), str):
        return str(cmd["stdout"])
    return None


def _command_state(commands: Mapping[str, Any]) -> str:
    if not commands or any(isinstance(c, Mapping) and c.get("missing")
                           for c in commands.values()):
        return "missing"
    cmd = commands.get("smi_q")
    if not isinstance(cmd, Mapping):
        return "not run"
    if cmd.get("timed_out"):
        return f"nvidia-smi -q timed out after {cmd.get('timeout_s')} s"
    if cmd.get("rc") != 0:
        out = str(cmd.get("stdout") or cmd.get("stderr") or cmd.get("error") or "").strip()
        return f"nvidia-smi -q exited {cmd.get('rc')}: {out.splitlines()[-1] if out else ''}"
    return "read"


def _driver(raw: Mapping[str, Any], nvml: Mapping[str, Any], smi_state: str,
            smi_driver: SmiValue | None, smi_cuda: SmiValue | None, gpus: int) -> Driver:
    if "missing" in nvml:
        nvml_state = f"pynvml does not import: {nvml['missing']}"
    elif "error" in nvml:
        nvml_state = f"NVML did not start: {_why(nvml['error'])}"
    else:
        nvml_state = "read"
    version = nvml.get("driver") if isinstance(nvml.get("driver"), str) and not _is_error(
        nvml.get("driver")) else (smi_driver.value if smi_driver else None)
    cuda_raw = nvml.get("cuda")
    cuda = (f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if isinstance(cuda_raw, int)
            else (smi_cuda.value if smi_cuda else None))
    env = raw.get("env") if isinstance(raw.get("env"), Mapping) else {}
    version_file = env.get("driver_version_file") if isinstance(env, Mapping) else None
    has_file = isinstance(version_file, Mapping) and "text" in version_file
    present = bool(version) or gpus > 0 or has_file or smi_state != "missing"
    return Driver(present=present, version=version, cuda=cuda, nvml=nvml_state,
                  nvidia_smi=smi_state)


def _pairs(indices: list[int], topo: TopoMatrix | None, p2p: dict[str, TopoMatrix | None],
           nvml_pairs: list[Mapping[str, Any]]) -> list[Pair]:
    by_pair = {(p.get("a"), p.get("b")): p for p in nvml_pairs if isinstance(p, Mapping)}
    out: list[Pair] = []
    for i in indices:
        for j in indices:
            if j <= i:
                continue
            evidence: list[str] = []
            link = topo.gpu_link(i, j) if topo else None
            if link is not None and topo is not None:
                evidence.append(f"nvidia-smi topo -m: {topo.lines.get(f'GPU{i}', '')!s}")
            status: dict[str, str | None] = {}
            nv = by_pair.get((i, j))
            for cap, letter in (("read", "r"), ("write", "w"), ("nvlink", "n"),
                                ("atomics", "a")):
                value = nv.get(cap) if nv else None
                if isinstance(value, int):
                    status[cap] = NVML_P2P.get(value, str(value))
                    evidence.append(f"nvml nvmlDeviceGetP2PStatus({i}, {j}, {cap})={value}")
                    continue
                matrix = p2p.get(letter)
                cell = matrix.gpu_link(i, j) if matrix else None
                status[cap] = cell
                if cell is not None and matrix is not None:
                    evidence.append(f"nvidia-smi topo -p2p {letter}: "
                                    f"{matrix.lines.get(f'GPU{i}', '')}")
            if link is None and nv and isinstance(nv.get("ancestor"), int):
                link = ("NVLink" if status.get("nvlink") == "OK"
                        else NVML_ANCESTOR.get(nv["ancestor"], str(nv["ancestor"])))
                evidence.append(f"nvml nvmlDeviceGetTopologyCommonAncestor({i}, {j})="
                                f"{nv['ancestor']}")
            out.append(Pair(a=i, b=j, link=link, p2p_read=status["read"],
                            p2p_write=status["write"], p2p_nvlink=status["nvlink"],
                            p2p_atomics=status["atomics"],
                            evidence=tuple(e.replace("\t", " ") for e in evidence)))
    return out


def _file_text(value: Any) -> str | None:
    return str(value["text"]) if isinstance(value, Mapping) and "text" in value else None


def environment(env: Mapping[str, Any]) -> Environment:
    """The environment section from the host script's ``env`` probes."""
    evidence: dict[str, str] = {}
    detect = env.get("detect_virt")
    word: str | None = None
    if isinstance(detect, Mapping):
        if detect.get("missing"):
            word = "missing"
        elif isinstance(detect.get("stdout"), str) and detect["stdout"].strip():
            word = detect["stdout"].strip()
            evidence["detect_virt"] = f"systemd-detect-virt: {word}"
    kernel = env.get("kernel") if isinstance(env.get("kernel"), str) else None
    hyper = env.get("cpuinfo_hypervisor")
    hyper = hyper if isinstance(hyper, bool) else None
    dmi_raw = env.get("dmi")
    dmi: Mapping[str, Any] = dmi_raw if isinstance(dmi_raw, Mapping) else {}
    vendor = _file_text(dmi.get("sys_vendor"))
    product = _file_text(dmi.get("product_name"))
    vendor = vendor.strip() if vendor else None
    product = product.strip() if product else None

    virtualization: str | None = None
    if word and word not in ("none", "missing") and word not in CONTAINER_WORDS:
        virtualization = word
    elif kernel and "-fc-" in kernel:
        virtualization = "firecracker"
        evidence["virtualization"] = f"uname -r: {kernel} (a Firecracker guest kernel)"
    elif vendor and any(v.lower() in vendor.lower() for v in _DMI_VMS):
        virtualization = vendor
        evidence["virtualization"] = f"/sys/class/dmi/id/sys_vendor: {vendor}"
    elif hyper:
        virtualization = "unknown hypervisor"
    if hyper:
        evidence["hypervisor_flag"] = "/proc/cpuinfo flags: hypervisor"
    pid1 = env.get("pid1_container")
    pid1_value: str | None = None
    if isinstance(pid1, Mapping):
        if "value" in pid1:
            pid1_value = pid1["value"]
            if pid1_value:
                evidence["pid1_container"] = f"/proc/1/environ: container={pid1_value}"
        elif "error" in pid1:
            pid1_value = f"unreadable: {pid1['error']}"
        elif pid1.get("missing"):
            pid1_value = "unreadable: /proc/1/environ missing"
    cgroup_lines: list[str] = []
    for key in ("cgroup_self", "cgroup_pid1"):
        text = _file_text(env.get(key))
        if text:
            cgroup_lines += [f"{'/proc/self' if key == 'cgroup_self' else '/proc/1'}/cgroup: "
                             f"{line}" for line in text.splitlines() if line.strip()]
    container: str | None = None
    joined = "\n".join(cgroup_lines)
    lxc = re.search(r"/lxc/(\d+)(/|$)", joined, re.M)
    if pid1_value == "lxc" or word in ("lxc", "lxc-libvirt") or "/lxc" in joined \
            or "lxc.payload" in joined:
        container = "proxmox-lxc" if lxc else "lxc"
        hit = next((line for line in cgroup_lines if "lxc" in line), None)
        if hit:
            evidence["container"] = hit
    elif "kubepods" in joined:
        container = "kubernetes"
        evidence["container"] = next(line for line in cgroup_lines if "kubepods" in line)
    elif pid1_value in ("podman", "oci") or env.get("containerenv"):
        container = "podman"
        evidence["container"] = "/run/.containerenv exists" if env.get("containerenv") \
            else f"/proc/1/environ: container={pid1_value}"
    elif pid1_value == "docker" or word == "docker" or "docker" in joined:
        container = "docker"
        hit = next((line for line in cgroup_lines if "docker" in line), None)
        evidence["container"] = hit or ("systemd-detect-virt: docker" if word == "docker"
                                        else "/proc/1/environ: container=docker")
    elif pid1_value and not pid1_value.startswith("unreadable"):
        container = pid1_value
    elif word in CONTAINER_WORDS:
        container = word
    if env.get("dockerenv"):
        evidence["dockerenv"] = "/.dockerenv exists"

    cmdline = _file_text(env.get("cmdline")) or ""
    iommu = tuple(w for w in cmdline.split() if "iommu" in w.lower() or w.startswith("iommu"))
    groups = env.get("iommu_groups") if isinstance(env.get("iommu_groups"), int) else None
    shm = env.get("shm")
    shm_bytes = shm.get("total_bytes") if isinstance(shm, Mapping) else None
    if isinstance(shm_bytes, int):
        evidence["shm"] = f"statvfs(/dev/shm): {shm_bytes} bytes"
    memlock = env.get("memlock")
    memlock_text: str | None = None
    if isinstance(memlock, Mapping) and isinstance(memlock.get("soft"), int):
        soft = memlock["soft"]
        memlock_text = "unlimited" if soft == memlock.get("unlimited") or soft < 0 else str(soft)
        evidence["memlock"] = f"RLIMIT_MEMLOCK soft={memlock_text}"
    huge = env.get("hugepages")
    total: int | None = None
    if isinstance(huge, str):
        found = re.search(r"HugePages_Total:\s*(\d+)", huge)
        total = int(found.group(1)) if found else None
    pers = env.get("persistenced")
    pids = tuple(p for p in pers if isinstance(p, int)) if isinstance(pers, list) else None
    return Environment(
        virtualization=virtualization, container=container, detect_virt=word,
        hypervisor_flag=hyper, dmi_vendor=vendor, dmi_product=product, kernel=kernel,
        pid1_container=pid1_value, dockerenv=bool(env.get("dockerenv")),
        containerenv=bool(env.get("containerenv")), cgroup=tuple(cgroup_lines),
        iommu_cmdline=iommu, iommu_groups=groups, shm_bytes=shm_bytes, memlock=memlock_text,
        hugepages_total=total, persistenced_pids=pids,
        logind=logind_ipc(env.get("logind"), env.get("logind_pids")), evidence=evidence)


def analyze(raw: Mapping[str, Any], *, host: str, elapsed_s: float = 0.0,
            gpus: list[int] | None = None, gpus_expected: bool = True) -> HostDoctor:
    """The report of one host from the host script's output ``raw``; ``gpus``: the indices in
    scope (``None``: all); ``gpus_expected``: whether no NVIDIA driver is a problem (see
    :func:`~cleanslate.doctor.findings.judge`). Never raises on a malformed ``raw``: what is
    missing is unknown, and an ``nvidia-smi -q`` that exited 0 with text that does not parse
    as its log (:class:`~cleanslate.doctor.parse.SmiParseError`: nothing, garbage, a field
    twice, a GPU more than it says) is a report with ``error`` (exit 3), since a field read
    from it may be a line that a process name printed."""
    commands = raw.get("commands") if isinstance(raw.get("commands"), Mapping) else {}
    assert isinstance(commands, Mapping)
    nvml = raw.get("nvml") if isinstance(raw.get("nvml"), Mapping) else {"missing": "not read"}
    assert isinstance(nvml, Mapping)
    env_raw = raw.get("env") if isinstance(raw.get("env"), Mapping) else {}
    assert isinstance(env_raw, Mapping)
    smi_text = _command_text(commands, "smi_q")
    smi = None
    if smi_text is not None:
        try:
            if commands["smi_q"].get("stdout_truncated"):
                raise SmiParseError(f"its output was cut at {len(smi_text)} characters")
            smi = parse_smi_q(smi_text)
        except SmiParseError as exc:
            return HostDoctor(host=host, elapsed_s=elapsed_s,
                              gpus_in_scope=tuple(gpus) if gpus is not None else None,
                              error=f"`nvidia-smi -q` exited 0 but printed what cleanslate "
                              f"cannot read as its log ({exc}): the GPUs cannot be told")
    nvml_gpus = [g for g in nvml.get("gpus") or [] if isinstance(g, Mapping)]
    count = max(len(nvml_gpus), len(smi.gpus) if smi else 0)
    builders = [_DeviceBuilder(i) for i in range(count)]
    for g in nvml_gpus:
        index = g.get("index")
        if isinstance(index, int) and 0 <= index < count:
            _nvml_device(builders[index], g)
    if smi:
        for i, sg in enumerate(smi.gpus):
            _smi_device(builders[i], sg)
    devices = [b.build() for b in builders]
    in_scope = sorted(set(gpus)) if gpus is not None else [d.index for d in devices]
    devices = [d for d in devices if d.index in in_scope]
    topo_text = _command_text(commands, "topo_m")
    topo = parse_topo_matrix(topo_text) if topo_text else None
    p2p: dict[str, TopoMatrix | None] = {}
    for letter in "rwna":
        text = _command_text(commands, f"p2p_{letter}")
        p2p[letter] = parse_p2p_matrix(text) if text else None
    if topo is not None:
        devices = [d.model_copy(update={
            "cpu_affinity": d.cpu_affinity or topo.cpu_affinity.get(f"GPU{d.index}"),
            "numa_node": d.numa_node or topo.numa_affinity.get(f"GPU{d.index}")})
            for d in devices]
    pairs = _pairs([d.index for d in devices], topo, p2p,
                   [p for p in nvml.get("p2p") or [] if isinstance(p, Mapping)])
    driver = _driver(raw, nvml, _command_state(commands), smi.driver if smi else None,
                     smi.cuda if smi else None, count)
    env = environment(env_raw)
    findings = judge(driver, devices, pairs, env, gpus_total=count, gpus_expected=gpus_expected)
    missing = [g for g in in_scope if g >= count]
    if missing and driver.present:
        findings.insert(0, DoctorFinding(
            code="gpu_not_found", severity=DoctorSeverity.ERROR, gpus=tuple(missing),
            message=f"GPU {', '.join(map(str, missing))} asked for with --gpus but the host "
            f"has {count} GPU(s)",
            consequence="nothing was read for it; a server placed on it will not start",
            evidence=(f"GPUs found: {count} (NVML and nvidia-smi -q)",)))
    return HostDoctor(host=host, elapsed_s=elapsed_s,
                      gpus_in_scope=tuple(gpus) if gpus is not None else None, driver=driver,
                      devices=tuple(devices), pairs=tuple(pairs), environment=env,
                      findings=tuple(findings))


__all__ = ["analyze", "environment"]
