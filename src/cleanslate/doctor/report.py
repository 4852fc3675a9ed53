"""The doctor's report: frozen models that serialize to the ``--json`` document.

A value that could not be read is ``None`` and its field is named in ``not_read`` with why
(``Not Supported``, ``N/A``, an NVML error): never a zero. Every finding cites its evidence, the
raw line or field it was judged on.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, computed_field

from cleanslate.errors import ExitCode
from cleanslate.models import FrozenStrict


class DoctorSeverity(StrEnum):
    """``error`` is a problem (exit 1); ``warning`` and ``info`` are said, exit 0."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class DoctorFinding(FrozenStrict):
    """One thing the doctor saw, what it means for serving, and the evidence it rests on."""

    code: str
    severity: DoctorSeverity
    message: str
    consequence: str
    gpus: tuple[int, ...] = ()
    evidence: tuple[str, ...] = ()


class Driver(FrozenStrict):
    """The NVIDIA driver as the host reports it; ``present`` is false without one."""

    present: bool
    version: str | None = None
    cuda: str | None = None
    nvml: str  # "read", or why not ("pynvml does not import: ...", an NVML error)
    nvidia_smi: str  # "read", "missing", or why not


class Device(FrozenStrict):
    """One GPU: NVML first, ``nvidia-smi -q`` for what NVML did not give (``source`` per
    field in ``sources``)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    persistence: bool | None = None
    mig: bool | None = None
    ecc: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    clock_event_reasons: tuple[str, ...] | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    temperature_c: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replays: int | None = None
    nvlink_up: int | None = None
    numa_node: str | None = None
    cpu_affinity: str | None = None
    sources: dict[str, str] = Field(default_factory=dict)
    not_read: dict[str, str] = Field(default_factory=dict)


class Pair(FrozenStrict):
    """Two GPUs: the link ``topo -m`` names (``NV18``, ``PHB``, ...) and P2P status per
    capability (``OK``, ``NS``, ``CNS``, ``GNS``, ``TNS``, ``U``, ``DISABLED``), NVML first,
    ``topo -p2p`` otherwise. ``evidence``: the lines or fields they came from."""

    a: int
    b: int
    link: str | None = None
    p2p_read: str | None = None
    p2p_write: str | None = None
    p2p_nvlink: str | None = None
    p2p_atomics: str | None = None
    evidence: tuple[str, ...] = ()


class LogindIpc(FrozenStrict):
    """Whether systemd-logind removes the engine's user's IPC objects (SysV IPC, POSIX shared
    memory in ``/dev/shm``) when that user's last session ends (``RemoveIPC=``,
    ``logind.conf(5)``), as the host's configuration files give it
    (:func:`cleanslate.doctor.logind.logind_ipc`).

    ``remove_ipc`` is ``None`` when a file that decides it could not be read (``unknown`` says
    which); ``setting`` says where the value came from (``FILE:LINE: RemoveIPC=yes``, or the
    compiled-in default and how it was told). ``uid``/``user``: the user the doctor's script
    ran as, the one an engine started the same way runs as. ``system_uid_max``: the highest UID
    systemd counts as a system user, whose IPC it never removes (root's neither).
    ``logind``: whether systemd-logind runs here or would be started (PID 1 is systemd);
    ``None``: could not be told."""

    remove_ipc: bool | None = None
    setting: str
    unknown: str | None = None
    files: tuple[str, ...] = ()  # the files read, in the order systemd applies them
    uid: int | None = None
    user: str | None = None
    system_uid_max: int
    system_uid_max_source: str
    logind: bool | None = None
    logind_evidence: str


class Environment(FrozenStrict):
    """What the host runs in and what NCCL needs from it."""

    virtualization: str | None = None  # a VM: "firecracker", "kvm", ...; None: none seen
    container: str | None = None  # "docker", "lxc", "proxmox-lxc", "podman", "kubernetes"
    detect_virt: str | None = None  # systemd-detect-virt's word, "missing" when absent
    hypervisor_flag: bool | None = None
    dmi_vendor: str | None = None
    dmi_product: str | None = None
    kernel: str | None = None
    pid1_container: str | None = None  # container= of PID 1, "unreadable: ..." when so
    dockerenv: bool = False
    containerenv: bool = False
    cgroup: tuple[str, ...] = ()
    iommu_cmdline: tuple[str, ...] = ()
    iommu_groups: int | None = None
    shm_bytes: int | None = None
    memlock: str | None = None  # "unlimited" or bytes of the soft limit
    hugepages_total: int | None = None
    persistenced_pids: tuple[int, ...] | None = None
    logind: LogindIpc | None = None  # None: the host script did not read it (an older one)
    evidence: dict[str, str] = Field(default_factory=dict)


class Measurement(FrozenStrict):
    """One measured figure (``--bandwidth``) and what the link allows, when known."""

    what: str
    gpus: tuple[int, ...] = ()
    value: float
    unit: str
    expected: float | None = None
    note: str | None = None


class Bandwidth(FrozenStrict):
    """``--bandwidth``: the figures, or why they were not measured."""

    skipped: str | None = None
    measurements: tuple[Measurement, ...] = ()
    elapsed_s: float | None = None
    notes: tuple[str, ...] = ()  # a part not measured and why (the all-reduce)


class HostDoctor(FrozenStrict):
    """One host's report. ``error``: the probe did not run or its output was unusable (then the
    sections are empty and the exit code is 3)."""

    host: str
    elapsed_s: float
    error: str | None = None
    gpus_in_scope: tuple[int, ...] | None = None
    driver: Driver | None = None
    devices: tuple[Device, ...] = ()
    pairs: tuple[Pair, ...] = ()
    environment: Environment | None = None
    bandwidth: Bandwidth | None = None
    findings: tuple[DoctorFinding, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return int(ExitCode.UNKNOWN)
        if any(f.severity == DoctorSeverity.ERROR for f in self.findings):
            return int(ExitCode.FAILED)
        return int(ExitCode.OK)


class DoctorReport(FrozenStrict):
    """Every host's report; the exit code is the worst (3 over 1 over 0)."""

    hosts: tuple[HostDoctor, ...]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int:
        codes = {h.exit_code for h in self.hosts}
        for code in (ExitCode.UNKNOWN, ExitCode.FAILED):
            if int(code) in codes:
                return int(code)
        return int(ExitCode.OK)


__all__ = [
    "Bandwidth",
    "Device",
    "DoctorFinding",
    "DoctorReport",
    "DoctorSeverity",
    "Driver",
    "Environment",
    "HostDoctor",
    "LogindIpc",
    "Measurement",
    "Pair",
]
