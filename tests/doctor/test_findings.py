"""Findings on real captures and on edited copies of them: each gives the right finding with
its evidence, and the right exit code."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.report import Bandwidth, DoctorSeverity, HostDoctor, Measurement
from cleanslate.doctor.run import _group_allows, bandwidth_findings, link_allows, pcie_allows
from tests.doctor.captures import H200X1, H200X2, edit_smi, h200x1_raw, h200x2_smi_raw, with_p2p


def codes(report: HostDoctor) -> dict[str, DoctorSeverity]:
    return {f.code: f.severity for f in report.findings}


def finding(report: HostDoctor, code: str) -> Any:
    found = [f for f in report.findings if f.code == code]
    assert found, f"no {code} among {codes(report)}"
    return found[0]


def test_the_real_single_h200_in_a_microvm() -> None:
    """The host script's own output on the H200 machine, and the hand capture of another
    such VM: a Firecracker guest, no problem (exit 0)."""
    for raw in (json.loads((H200X1 / "doctor-raw.json").read_text()), h200x1_raw()):
        report = analyze(raw, host="h200")
        assert report.exit_code == 0
        assert report.driver is not None and report.driver.version == "580.159.04"
        assert report.driver.cuda == "13.0" and report.driver.nvml == "read"
        (gpu,) = report.devices
        assert gpu.name == "NVIDIA H200" and gpu.pci_bus_id == "00000000:00:06.0"
        assert (gpu.pcie_gen, gpu.pcie_gen_max, gpu.pcie_width, gpu.pcie_width_max) == (
            5, 5, 16, 16)
        assert gpu.persistence is True and gpu.ecc is True and gpu.mig is False
        assert gpu.clock_event_reasons == ("Idle",)
        assert gpu.power_limit_w == gpu.power_default_w == 700.0
        assert gpu.cpu_affinity == "0-15"
        assert gpu.nvlink_up is None and "Not Supported" in gpu.not_read["nvlink_up"]
        assert gpu.retired_pages_pending is None and "retired_pages_pending" in gpu.not_read
        env = report.environment
        assert env is not None and env.virtualization == "firecracker"
        assert env.memlock == "unlimited" and env.shm_bytes == 128 << 30
        assert env.pid1_container is not None and env.pid1_container.startswith("unreadable")
        assert codes(report) == {"virtual_machine": DoctorSeverity.INFO,
                                 "dockerenv": DoctorSeverity.INFO}
        vm = finding(report, "virtual_machine")
        assert any("-fc-" in e for e in vm.evidence)


def test_two_h200_with_nv18_and_a_replay() -> None:
    report = analyze(h200x2_smi_raw(), host="h200x2")
    assert [d.pci_bus_id for d in report.devices] == ["00000000:00:06.0", "00000000:00:07.0"]
    (pair,) = report.pairs
    assert pair.link == "NV18" and pair.p2p_read is None
    replays = finding(report, "pcie_replays")
    assert replays.gpus == (1,) and replays.severity == DoctorSeverity.WARNING
    assert replays.evidence == ("nvidia-smi -q GPU 00000000:00:07.0: PCI/Replays Since Reset : 1",)
    assert "pcie_host_path" not in codes(report)
    assert codes(report)["p2p_unknown"] == DoctorSeverity.INFO
    assert report.exit_code == 0


def test_p2p_read_not_supported_between_0_and_1() -> None:
    raw = with_p2p(with_p2p(h200x2_smi_raw(), "r", "NS"), "w", "OK")
    report = analyze(raw, host="h")
    f = finding(report, "p2p_not_supported")
    assert f.severity == DoctorSeverity.ERROR and f.gpus == (0, 1)
    assert "read" in f.message and "custom all-reduce falls back to NCCL" in f.consequence
    assert any(e.startswith("nvidia-smi topo -p2p r: GPU0 X NS") for e in f.evidence)
    assert report.exit_code == 1
    assert report.pairs[0].p2p_read == "NS" and report.pairs[0].p2p_write == "OK"


def test_p2p_status_from_nvml_comes_first() -> None:
    raw = with_p2p(h200x2_smi_raw(), "r", "OK")
    raw["nvml"] = {"driver": "580.159.04", "cuda": 13000, "gpus": [], "p2p": [
        {"a": 0, "b": 1, "read": 5, "write": 0, "nvlink": 5, "atomics": 0, "ancestor": 30}]}
    report = analyze(raw, host="h")
    assert report.pairs[0].p2p_read == "NS" and report.pairs[0].p2p_nvlink == "NS"
    f = finding(report, "p2p_not_supported")
    assert "nvml nvmlDeviceGetP2PStatus(0, 1, read)=5" in f.evidence


def test_a_pair_through_the_host_bridge() -> None:
    raw = h200x2_smi_raw()
    raw["commands"]["topo_m"]["stdout"] = raw["commands"]["topo_m"]["stdout"].replace(
        "NV18", "PHB")
    report = analyze(raw, host="h")
    f = finding(report, "pcie_host_path")
    assert f.severity == DoctorSeverity.WARNING and f.gpus == (0, 1)
    assert "PHB" in f.message and "host bridge" in f.consequence
    assert f.evidence == ("nvidia-smi topo -m: GPU0  X  PHB 0-31 0  N/A",)


def test_a_pcie_link_at_x8_of_x16() -> None:
    raw = edit_smi(h200x2_smi_raw(), 1, ("Link Width", "Current"), "16x", "8x")
    report = analyze(raw, host="h")
    f = finding(report, "pcie_width_downtrained")
    assert f.severity == DoctorSeverity.ERROR and f.gpus == (1,)
    assert f.message == "GPU 1: PCIe link at x8 of x16"
    assert "PCI/GPU Link Info/Link Width/Current : 8x" in f.evidence[0]
    assert report.exit_code == 1
    # Through NVML, which comes first where it answers.
    raw = h200x1_raw()
    raw["nvml"]["gpus"][0]["pcie_width"] = 8
    f = finding(analyze(raw, host="h"), "pcie_width_downtrained")
    assert f.evidence[0] == "nvml pcie_width=8"


def test_a_lower_pcie_gen_while_idle_is_said_carefully() -> None:
    raw = h200x1_raw()
    raw["nvml"]["gpus"][0]["pcie_gen"] = 1
    report = analyze(raw, host="h")
    f = finding(report, "pcie_gen_below_max")
    assert f.severity == DoctorSeverity.INFO and "while idle" in f.message
    assert "normal" in f.consequence and report.exit_code == 0


def test_pending_retired_pages_and_remapped_rows() -> None:
    raw = edit_smi(h200x2_smi_raw(), 0, "Pending Page Blacklist", "N/A", "Yes")
    f = finding(analyze(raw, host="h"), "retired_pages_pending")
    assert f.severity == DoctorSeverity.ERROR and f.gpus == (0,)
    assert f.evidence == ("nvidia-smi -q GPU 00000000:00:06.0: Retired Pages/Pending Page "
                          "Blacklist : Yes",)
    raw = edit_smi(h200x2_smi_raw(), 1, "Remapped Rows", "No", "Yes")
    report = analyze(raw, host="h")
    f = finding(report, "remapped_rows_pending")
    assert f.gpus == (1,) and "Remapped Rows/Pending : Yes" in f.evidence[0]
    assert report.exit_code == 1
    # NVML's remapped rows: (correctable, uncorrectable, pending, failure)
    raw = h200x1_raw()
    raw["nvml"]["gpus"][0]["remapped"] = [0, 2, 0, 1]
    assert codes(analyze(raw, host="h"))["remapped_rows_failure"] == DoctorSeverity.ERROR


def test_device_health_from_nvml() -> None:
    raw = h200x1_raw()
    g = raw["nvml"]["gpus"][0]
    g.update(ecc_uncorrected_volatile=3, throttle=0x1 | 0x40, power_limit=500000,
             persistence=0, pcie_replay=12)
    report = analyze(raw, host="h")
    got = codes(report)
    assert got["ecc_uncorrected"] == DoctorSeverity.ERROR
    assert got["clock_events"] == DoctorSeverity.ERROR  # HW thermal slowdown
    assert finding(report, "clock_events").message == (
        "GPU 0: clocks held down by HW Thermal Slowdown")
    assert got["power_limit_below_default"] == DoctorSeverity.WARNING
    assert got["persistence_off"] == DoctorSeverity.WARNING
    assert got["pcie_replays"] == DoctorSeverity.WARNING
    assert [f.severity for f in report.findings] == sorted(
        (f.severity for f in report.findings),
        key=[DoctorSeverity.ERROR, DoctorSeverity.WARNING, DoctorSeverity.INFO].index)
    g.update(ecc_uncorrected_volatile=0, throttle=0x4, power_limit=700000, persistence=1,
             pcie_replay=0)
    assert codes(analyze(raw, host="h"))["clock_events"] == DoctorSeverity.WARNING  # SW power cap


def test_an_lxc_container_with_p2p_not_supported() -> None:
    raw = with_p2p(h200x2_smi_raw(), "r", "NS")
    env = raw["env"]
    env["pid1_container"] = {"value": "lxc"}
    env["cgroup_pid1"] = {"text": "0::/lxc/101/ns/init.scope\n"}
    env["kernel"] = "6.8.12-4-pve"
    env["cpuinfo_hypervisor"] = False
    env["dockerenv"] = False
    env["detect_virt"] = {"argv": ["systemd-detect-virt"], "rc": 0, "stdout": "lxc\n",
                          "stderr": ""}
    report = analyze(raw, host="h")
    assert report.environment is not None
    assert report.environment.container == "proxmox-lxc"
    assert report.environment.virtualization is None
    f = finding(report, "container_lxc")
    assert f.severity == DoctorSeverity.WARNING and "Proxmox" in f.message
    assert "/proc/1/environ: container=lxc" in f.evidence
    assert "/proc/1/cgroup: 0::/lxc/101/ns/init.scope" in f.evidence
    p2p = finding(report, "p2p_not_supported")
    assert "(in a proxmox-lxc container)" in p2p.message
    assert "virtual_machine" not in codes(report)


def test_a_docker_container_with_a_small_shm_and_memlock() -> None:
    raw = h200x2_smi_raw()
    raw["env"].update(cgroup_pid1={"text": "0::/system.slice/docker-abc.scope\n"},
                      shm={"total_bytes": 64 << 20, "free_bytes": 64 << 20},
                      memlock={"soft": 8 << 20, "hard": 8 << 20, "unlimited": -1})
    report = analyze(raw, host="h")
    assert report.environment is not None and report.environment.container == "docker"
    got = codes(report)
    assert got["container"] == DoctorSeverity.INFO
    assert got["shm_small"] == DoctorSeverity.ERROR  # two GPUs: NCCL needs it
    assert finding(report, "shm_small").message == "/dev/shm is 64 MiB"
    assert got["memlock_limited"] == DoctorSeverity.WARNING
    assert report.exit_code == 1
    # One GPU in scope: a warning.
    assert codes(analyze(raw, host="h", gpus=[0]))["shm_small"] == DoctorSeverity.WARNING


def test_a_machine_without_a_driver() -> None:
    raw = h200x1_raw()
    raw["commands"] = {"nvidia_smi": {"argv": ["nvidia-smi"], "missing": True}}
    raw["nvml"] = {"error": "ERR NVMLError_LibraryNotFound: NVML Shared Library Not Found"}
    report = analyze(raw, host="cpu")
    assert report.driver is not None and not report.driver.present
    assert report.driver.nvidia_smi == "missing"
    assert report.devices == () and report.environment is not None
    f = finding(report, "no_driver")
    # Examined and found unfit to serve on GPUs: a problem (exit 1), never "no problem found".
    assert f.severity == DoctorSeverity.ERROR and report.exit_code == 1
    assert f.message == "no NVIDIA driver or GPU found"
    assert "nothing can be served on NVIDIA GPUs here" in f.consequence
    assert "--gpu-backend none" in f.consequence
    assert "NVML: NVML did not start: NVML Shared Library Not Found" in f.evidence
    # A host meant to serve without GPUs (doctor --gpu-backend none; the snapshot of a run):
    cpu = analyze(raw, host="cpu", gpus_expected=False)
    assert finding(cpu, "no_driver").severity == DoctorSeverity.INFO and cpu.exit_code == 0


def test_gpus_in_scope() -> None:
    raw = edit_smi(h200x2_smi_raw(), 0, ("Link Width", "Current"), "16x", "8x")
    report = analyze(raw, host="h", gpus=[1])
    assert [d.index for d in report.devices] == [1] and report.pairs == ()
    assert "pcie_width_downtrained" not in codes(report)
    report = analyze(h200x2_smi_raw(), host="h", gpus=[1, 5])
    f = finding(report, "gpu_not_found")
    assert f.gpus == (5,) and report.exit_code == 1


@pytest.mark.parametrize("raw", [{}, {"commands": None, "nvml": 3, "env": []},
                                 {"commands": {"smi_q": {"rc": 0, "stdout": "garbage"}}}])
def test_malformed_output_is_unknown_not_an_exception(raw: dict[str, Any]) -> None:
    report = analyze(raw, host="h")
    assert report.devices == ()


def test_bandwidth_against_the_link() -> None:
    assert link_allows("NV18", None) == 450.0
    report = analyze(h200x2_smi_raw(), host="h")
    assert pcie_allows(report.devices[0]) == pytest.approx(63.0, abs=0.1)
    bw = Bandwidth(measurements=(
        Measurement(what="GPU-to-GPU copy", gpus=(0, 1), value=40.0, unit="GB/s",
                    expected=450.0, note="link NV18"),
        Measurement(what="host-to-device copy (pinned)", gpus=(0,), value=55.2, unit="GB/s",
                    expected=63.0),
        Measurement(what="tiny copy latency (4 bytes)", gpus=(0,), value=9.5, unit="us")))
    links: dict[tuple[int, int], str | None] = {(0, 1): "NV18"}
    devices = {d.index: d for d in report.devices}
    assert _group_allows((0, 1), links, devices) == (450.0, "slowest link 0-1: NV18")
    links[(0, 1)] = "PHB"
    allows, note = _group_allows((0, 1), links, devices)
    assert allows == pytest.approx(63.0, abs=0.1) and note == "slowest link 0-1: PHB"
    (low,) = bandwidth_findings(bw)
    assert low.code == "bandwidth_low" and low.gpus == (0, 1)
    assert "9% of the 450 GB/s" in low.message


def test_the_report_json_of_the_real_h200_reads_back() -> None:
    """``doctor --bandwidth --json`` as it ran on the H200 machine (the figures in
    docs/doctor.md)."""
    from cleanslate.doctor.report import DoctorReport

    doc = json.loads((H200X1 / "doctor-report.json").read_text())
    for host in doc["hosts"]:
        host.pop("exit_code")
    doc.pop("exit_code")
    report = DoctorReport.model_validate(doc)
    (host,) = report.hosts
    assert host.bandwidth is not None and host.bandwidth.skipped is None
    h2d = next(m for m in host.bandwidth.measurements if m.what.startswith("host-to-device"))
    assert 40 < h2d.value < h2d.expected  # type: ignore[operator]
    assert report.exit_code == 0
    assert copy.deepcopy(H200X2) == H200X2
