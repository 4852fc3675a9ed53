"""The doctor's rules: what each reading means for serving, with the evidence it rests on.

``error`` is a problem that will cost performance or correctness now (exit 1); ``warning`` is
worth knowing before a benchmark; ``info`` says how the host is set up. Each rule is listed
with its consequence in ``docs/doctor.md``.
"""

from __future__ import annotations

from cleanslate.doctor.report import (
    Device,
    DoctorFinding,
    DoctorSeverity,
    Driver,
    Environment,
    LogindIpc,
    Pair,
)

#: ``systemd-detect-virt`` words that are containers, not virtual machines.
CONTAINER_WORDS = frozenset({"docker", "lxc", "lxc-libvirt", "podman", "systemd-nspawn",
                             "openvz", "rkt", "wsl", "proot", "pouch"})
#: NCCL keeps its intra-node buffers in ``/dev/shm``: below this it fails or falls back.
SHM_MIN_BYTES = 1 << 30
#: Links through which GPU-to-GPU traffic crosses a host bridge or the CPU interconnect.
HOST_PATHS = {"PHB": "a PCIe host bridge (the CPU)",
              "NODE": "the interconnect between PCIe host bridges of a NUMA node",
              "SYS": "the interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)"}
#: Clock-event reasons that mean the hardware is slowing the GPU down.
HW_REASONS = frozenset({"HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown"})
#: Reasons that are not a problem on their own.
BENIGN_REASONS = frozenset({"Idle", "Applications Clocks Setting", "Sync Boost",
                            "Display Clock Setting"})

_ALLREDUCE = ("SGLang/vLLM custom all-reduce falls back to NCCL, whose traffic then goes "
              "through host memory; expect TP>1 decode to be bound by it")


def _ev(device: Device, *fields: str) -> tuple[str, ...]:
    return tuple(device.sources[f] for f in fields if f in device.sources)


def _device_findings(d: Device) -> list[DoctorFinding]:
    out: list[DoctorFinding] = []
    g = (d.index,)
    if d.pcie_width is not None and d.pcie_width_max is not None \
            and d.pcie_width < d.pcie_width_max:
        out.append(DoctorFinding(
            code="pcie_width_downtrained", severity=DoctorSeverity.ERROR, gpus=g,
            message=f"GPU {d.index}: PCIe link at x{d.pcie_width} of x{d.pcie_width_max}",
            consequence="host-to-device copies, host-staged P2P and NCCL traffic over PCIe "
            f"get at most {d.pcie_width}/{d.pcie_width_max} of the bandwidth; a narrower "
            "link does not come back by itself (reseat the card, check the riser or slot, "
            "or the VM's passthrough)",
            evidence=_ev(d, "pcie_width", "pcie_width_max")))
    if d.pcie_gen is not None and d.pcie_gen_max is not None and d.pcie_gen < d.pcie_gen_max:
        idle = d.clock_event_reasons is not None and "Idle" in d.clock_event_reasons
        out.append(DoctorFinding(
            code="pcie_gen_below_max", severity=DoctorSeverity.INFO, gpus=g,
            message=f"GPU {d.index}: PCIe gen {d.pcie_gen} of gen {d.pcie_gen_max}"
            + (" while idle" if idle else ""),
            consequence="a GPU lowers its PCIe generation to save power when idle and raises "
            "it under load, so this alone is normal; read it again under load (or with "
            "--bandwidth): a link that stays below its maximum under load is a problem",
            evidence=_ev(d, "pcie_gen", "pcie_gen_max", "clock_event_reasons")))
    if d.pcie_replays:
        out.append(DoctorFinding(
            code="pcie_replays", severity=DoctorSeverity.WARNING, gpus=g,
            message=f"GPU {d.index}: {d.pcie_replays} PCIe replay(s) since the last reset",
            consequence="replays are link-level retransmissions after bad packets; a few are "
            "harmless, a count that keeps growing means a marginal link (riser, slot, "
            "signal integrity) that costs bandwidth and can end in the GPU falling off the bus",
            evidence=_ev(d, "pcie_replays")))
    if d.retired_pages_pending:
        out.append(DoctorFinding(
            code="retired_pages_pending", severity=DoctorSeverity.ERROR, gpus=g,
            message=f"GPU {d.index}: retired pages pending",
            consequence="memory pages with errors are waiting to be retired, which happens "
            "only at the next GPU reset or reboot; until then the bad memory is still in use",
            evidence=_ev(d, "retired_pages_pending")))
    if d.remapped_rows_pending:
        out.append(DoctorFinding(
            code="remapped_rows_pending", severity=DoctorSeverity.ERROR, gpus=g,
            message=f"GPU {d.index}: row remapping pending",
            consequence="a memory row with an uncorrectable error will be remapped at the next "
            "GPU reset; reset the GPU (no process may hold it) before serving",
            evidence=_ev(d, "remapped_rows_pending")))
    if d.remapped_rows_failure:
        out.append(DoctorFinding(
            code="remapped_rows_failure", severity=DoctorSeverity.ERROR, gpus=g,
            message=f"GPU {d.index}: row remapping failed",
            consequence="the GPU ran out of spare rows for failing memory; it needs service",
            evidence=_ev(d, "remapped_rows_failure")))
    if d.ecc_uncorrected_volatile:
        out.append(DoctorFinding(
            code="ecc_uncorrected", severity=DoctorSeverity.ERROR, gpus=g,
            message=f"GPU {d.index}: {d.ecc_uncorrected_volatile} uncorrectable ECC error(s) "
            "since the driver loaded",
            consequence="an uncorrectable error kills the process that hit it (Xid 48/63/64) "
            "and can corrupt results; expect crashes mid-benchmark",
            evidence=_ev(d, "ecc_uncorrected_volatile")))
    if d.clock_event_reasons:
        bad = [r for r in d.clock_event_reasons if r not in BENIGN_REASONS]
        if bad:
            hw = [r for r in bad if r in HW_REASONS]
            out.append(DoctorFinding(
                code="clock_events",
                severity=DoctorSeverity.ERROR if hw else DoctorSeverity.WARNING,
                gpus=g, message=f"GPU {d.index}: clocks held down by {', '.join(bad)}",
                consequence="the GPU runs below its clocks for a reason other than being "
                "idle: "
                + ("the hardware is slowing it (temperature, power brake or an external "
                   "signal), so any figure measured now is low" if hw
                   else "a power or thermal cap set in software; figures are capped by it"),
                evidence=_ev(d, "clock_event_reasons")))
    if d.power_limit_w is not None and d.power_default_w is not None \
            and d.power_limit_w < d.power_default_w - 0.5:
        out.append(DoctorFinding(
            code="power_limit_below_default", severity=DoctorSeverity.WARNING, gpus=g,
            message=f"GPU {d.index}: power limit {d.power_limit_w:g} W below the default "
            f"{d.power_default_w:g} W",
            consequence="under load the GPU is capped earlier than it was designed for; "
            "prefill-heavy work slows first (nvidia-smi -pl sets it back)",
            evidence=_ev(d, "power_limit_w", "power_default_w")))
    if d.persistence is False:
        out.append(DoctorFinding(
            code="persistence_off", severity=DoctorSeverity.WARNING, gpus=g,
            message=f"GPU {d.index}: persistence mode off",
            consequence="the driver tears the GPU state down when the last process exits and "
            "sets it up again on the next start: seconds added to every launch, and readings "
            "between runs may find the GPU uninitialized (nvidia-persistenced or "
            "nvidia-smi -pm 1)",
            evidence=_ev(d, "persistence")))
    if d.mig:
        out.append(DoctorFinding(
            code="mig_enabled", severity=DoctorSeverity.INFO, gpus=g,
            message=f"GPU {d.index}: MIG mode enabled",
            consequence="the GPU is split into instances; an engine sees one instance, not "
            "the whole GPU, and P2P/NVLink between instances is not available",
            evidence=_ev(d, "mig")))
    if d.ecc is False:
        out.append(DoctorFinding(
            code="ecc_off", severity=DoctorSeverity.INFO, gpus=g,
            message=f"GPU {d.index}: ECC off",
            consequence="memory errors are neither corrected nor counted: a little more "
            "memory and bandwidth, and no warning when memory goes bad",
            evidence=_ev(d, "ecc")))
    return out


def _pair_findings(pairs: list[Pair], env: Environment) -> list[DoctorFinding]:
    out: list[DoctorFinding] = []
    where = ""
    if env.container:
        where = f" (in a {env.container} container)"
    elif env.virtualization:
        where = f" (in a {env.virtualization} virtual machine)"
    for p in pairs:
        g = (p.a, p.b)
        failed = {cap: status for cap, status in (("read", p.p2p_read), ("write", p.p2p_write))
                  if status is not None and status != "OK"}
        if failed:
            what = " and ".join(f"{cap} {status}" for cap, status in failed.items())
            out.append(DoctorFinding(
                code="p2p_not_supported", severity=DoctorSeverity.ERROR, gpus=g,
                message=f"P2P {' and '.join(failed)} not supported between GPUs {p.a} and "
                f"{p.b} ({what}){where}",
                consequence=_ALLREDUCE + "; tensor- and expert-parallel layers pay it on every "
                "token",
                evidence=p.evidence))
        if p.p2p_read is None and p.p2p_write is None:
            out.append(DoctorFinding(
                code="p2p_unknown", severity=DoctorSeverity.INFO, gpus=g,
                message=f"P2P status between GPUs {p.a} and {p.b} not read",
                consequence="neither NVML nor nvidia-smi topo -p2p answered: whether custom "
                "all-reduce can use P2P here is unknown (--bandwidth measures it)",
                evidence=p.evidence))
        if p.link in HOST_PATHS:
            out.append(DoctorFinding(
                code="pcie_host_path", severity=DoctorSeverity.WARNING, gpus=g,
                message=f"GPUs {p.a} and {p.b} are connected through {p.link}, not NVLink",
                consequence=f"their traffic crosses {HOST_PATHS[p.link]}: all-reduce bandwidth "
                "is PCIe's at best (tens of GB/s instead of hundreds over NVLink); choose GPUs "
                "on one switch or NVLink for tensor parallelism, and measure with --bandwidth",
                evidence=tuple(e for e in p.evidence if "topo -m" in e or "Ancestor" in e)))
    return out


def _container_evidence(env: Environment) -> tuple[str, ...]:
    ev = env.evidence
    keys = ["pid1_container", "container"]
    if env.detect_virt in CONTAINER_WORDS:
        keys.append("detect_virt")
    return tuple(dict.fromkeys(ev[k] for k in keys if k in ev))


def _env_findings(env: Environment, driver: Driver, gpus: int) -> list[DoctorFinding]:
    out: list[DoctorFinding] = []
    ev = env.evidence
    if env.virtualization:
        out.append(DoctorFinding(
            code="virtual_machine", severity=DoctorSeverity.INFO,
            message=f"running in a virtual machine: {env.virtualization}",
            consequence="GPUs in a VM are passed through by the hypervisor: P2P between them "
            "works only where the hypervisor exposes it (IOMMU/ACS settings, NVLink passed "
            "through with the GPUs); NCCL inside VMs has measured far below bare metal where "
            "P2P was routed through the host. Check the P2P status below and --bandwidth",
            evidence=tuple(ev[k] for k in ("detect_virt", "virtualization", "hypervisor_flag")
                           if k in ev and (k != "detect_virt" or env.detect_virt
                                           not in CONTAINER_WORDS))))
    if env.container in ("lxc", "proxmox-lxc"):
        out.append(DoctorFinding(
            code="container_lxc", severity=DoctorSeverity.WARNING,
            message="running in an LXC container" + (
                " (Proxmox)" if env.container == "proxmox-lxc" else ""),
            consequence="the GPUs are the host's devices bind-mounted into the container: "
            "P2P and NCCL's shared-memory and IPC paths depend on the host's kernel, IOMMU and "
            "the container's limits (/dev/shm, memlock); P2P routed through the host bridge "
            "here makes tensor-parallel all-reduce slow whatever the engine's flags",
            evidence=_container_evidence(env)))
    elif env.container:
        out.append(DoctorFinding(
            code="container", severity=DoctorSeverity.INFO,
            message=f"running in a {env.container} container",
            consequence="NCCL needs the container's /dev/shm and memlock limits raised "
            "(docker: --shm-size, --ulimit memlock=-1, --ipc=host) and the GPUs of a "
            "tensor-parallel group visible together",
            evidence=_container_evidence(env)))
    elif env.dockerenv:
        out.append(DoctorFinding(
            code="dockerenv", severity=DoctorSeverity.INFO,
            message="/.dockerenv exists but no container runtime shows in the cgroup paths",
            consequence="the root file system was probably built from a Docker image; on its "
            "own this says nothing about isolation",
            evidence=(ev["dockerenv"],)))
    if env.shm_bytes is not None and env.shm_bytes < SHM_MIN_BYTES:
        out.append(DoctorFinding(
            code="shm_small", severity=DoctorSeverity.ERROR if gpus > 1 else DoctorSeverity.WARNING,
            message=f"/dev/shm is {env.shm_bytes / 2**20:.0f} MiB",
            consequence="NCCL keeps its intra-node buffers in /dev/shm: with less than 1 GiB "
            "multi-GPU runs fail with 'unhandled system error' or fall back to slower paths "
            "(docker's default is 64 MiB: --shm-size or --ipc=host)",
            evidence=(ev.get("shm", ""),)))
    if env.memlock is not None and env.memlock != "unlimited" and driver.present:
        out.append(DoctorFinding(
            code="memlock_limited", severity=DoctorSeverity.WARNING,
            message=f"locked-memory limit is {int(env.memlock) // 1024} KiB",
            consequence="pinned host memory (NCCL over InfiniBand/GPUDirect, CUDA host "
            "registration) is capped by it; NCCL and the NVIDIA docs ask for unlimited "
            "(ulimit -l unlimited, docker --ulimit memlock=-1)",
            evidence=(ev.get("memlock", ""),)))
    return out


def _logind_findings(ipc: LogindIpc | None) -> list[DoctorFinding]:
    """``RemoveIPC=yes`` (or unknown) for a user whose IPC systemd-logind removes: not root, not
    a system user, on a host where logind runs or would be started."""
    if ipc is None or ipc.logind is False or ipc.uid is None or ipc.remove_ipc is False:
        return []
    if ipc.uid == 0 or ipc.uid <= ipc.system_uid_max:
        return []
    who = f"UID {ipc.uid}" + (f" ({ipc.user})" if ipc.user else "")
    user = (f"the engine runs as {who}, the doctor's user, above SYSTEM_UID_MAX "
            f"{ipc.system_uid_max}: {ipc.system_uid_max_source}")
    consequence = (
        f"when the last login session of {who} ends (an SSH login closed, a cron job or an "
        "su that ended) while an engine of that user runs outside it (a detached server, a "
        "service), systemd-logind deletes every System V IPC object and every POSIX "
        "shared-memory file in /dev/shm the user owns, under the running engine: vLLM's "
        "shared-memory ring buffer between its API server and its engine core, NCCL's "
        "buffers; the engine fails or hangs mid-run (vllm#54259). Set RemoveIPC=no in a "
        "drop-in (/etc/systemd/logind.conf.d/60-removeipc.conf: [Login] then RemoveIPC=no; "
        "then systemctl restart systemd-logind) or run the engine as a system user "
        f"(UID {ipc.system_uid_max} or below)")
    if ipc.remove_ipc is None:
        return [DoctorFinding(
            code="remove_ipc_unknown", severity=DoctorSeverity.WARNING,
            message=f"whether systemd-logind removes {who}'s shared memory at logout is "
            f"unknown: {ipc.unknown}",
            consequence="a file that decides RemoveIPC= could not be read; systemd's default "
            "is yes, and if it is: " + consequence,
            evidence=(ipc.setting, user, ipc.logind_evidence))]
    return [DoctorFinding(
        code="remove_ipc", severity=DoctorSeverity.WARNING,
        message=f"systemd-logind removes {who}'s shared memory and IPC objects when its last "
        "session ends (RemoveIPC=yes)",
        consequence=consequence,
        evidence=(ipc.setting, user, ipc.logind_evidence))]


def judge(driver: Driver, devices: list[Device], pairs: list[Pair], env: Environment, *,
          gpus_total: int, gpus_expected: bool = True) -> list[DoctorFinding]:
    """Every finding for one host, errors first. ``gpus_expected``: the host is meant to serve
    on NVIDIA GPUs, so no driver is an error (a host examined and found unfit, exit 1); without
    it (``doctor --gpu-backend none``, a snapshot beside a CPU engine) it is information."""
    out: list[DoctorFinding] = []
    if not driver.present:
        evidence = (f"nvidia-smi: {driver.nvidia_smi}", f"NVML: {driver.nvml}",
                    "/proc/driver/nvidia/version: not read")
        if gpus_expected:
            out.append(DoctorFinding(
                code="no_driver", severity=DoctorSeverity.ERROR,
                message="no NVIDIA driver or GPU found",
                consequence="nothing can be served on NVIDIA GPUs here: an engine asked for "
                "GPUs fails to start (CUDA finds no device), and GPU memory, clocks and links "
                "cannot be checked. Install the driver or use a GPU host; if this host is "
                "meant to serve on CPU (the sim, transformers on CPU), run doctor with "
                "--gpu-backend none",
                evidence=evidence))
        else:
            out.append(DoctorFinding(
                code="no_driver", severity=DoctorSeverity.INFO,
                message="no NVIDIA driver or GPU found (none expected: --gpu-backend none)",
                consequence="nothing GPU-related to check here; the environment is still "
                "reported",
                evidence=evidence))
    else:
        if driver.nvidia_smi == "missing":
            out.append(DoctorFinding(
                code="nvidia_smi_missing", severity=DoctorSeverity.INFO,
                message="nvidia-smi is not on the PATH",
                consequence="topology (topo -m) and the P2P matrices come from NVML only",
                evidence=("nvidia-smi: missing",)))
        if driver.nvidia_smi not in ("read", "missing") and driver.nvml != "read":
            out.append(DoctorFinding(
                code="gpu_unreadable", severity=DoctorSeverity.ERROR,
                message=f"the driver does not answer: {driver.nvidia_smi}",
                consequence="nvidia-smi is there but failed, and NVML gave nothing: a GPU "
                "that fell off the bus or a driver in trouble (see dmesg for Xid lines); "
                "nothing about the GPUs could be read",
                evidence=(f"nvidia-smi: {driver.nvidia_smi}", f"NVML: {driver.nvml}")))
        if not driver.nvml.startswith("read"):
            out.append(DoctorFinding(
                code="nvml_unavailable", severity=DoctorSeverity.INFO,
                message=f"NVML not read: {driver.nvml}",
                consequence="devices and P2P status come from nvidia-smi alone (install "
                "nvidia-ml-py on the host for NVML's fields)",
                evidence=(f"NVML: {driver.nvml}",)))
    for d in devices:
        out += _device_findings(d)
    out += _pair_findings(pairs, env)
    out += _env_findings(env, driver, len(devices) or gpus_total)
    out += _logind_findings(env.logind)
    order = {DoctorSeverity.ERROR: 0, DoctorSeverity.WARNING: 1, DoctorSeverity.INFO: 2}
    return sorted(out, key=lambda f: order[f.severity])


__all__ = ["CONTAINER_WORDS", "SHM_MIN_BYTES", "judge"]
