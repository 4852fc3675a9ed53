"""The ``nvidia-smi`` parsers on real captures: one H200 in a microVM, two H200 with NV18."""

from __future__ import annotations

from cleanslate.doctor.parse import (
    parse_p2p_matrix,
    parse_smi_q,
    parse_topo_matrix,
    smi_bool,
    smi_float,
    smi_int,
)
from tests.doctor.captures import H200X1, H200X2, P2P_TEMPLATE


def test_topo_m_of_two_h200_with_nvlink() -> None:
    topo = parse_topo_matrix((H200X2 / "topo.out").read_text())
    assert topo is not None
    assert topo.devices == ("GPU0", "GPU1")
    assert topo.gpu_link(0, 1) == topo.gpu_link(1, 0) == "NV18"
    assert topo.gpu_link(0, 0) == "X"
    assert topo.cpu_affinity == {"GPU0": "0-31", "GPU1": "0-31"}
    assert topo.numa_affinity == {"GPU0": "0", "GPU1": "0"}
    assert "\x1b" not in "".join(topo.lines.values())


def test_topo_m_of_one_gpu_and_the_p2p_matrices() -> None:
    topo = parse_topo_matrix((H200X1 / "topo-m.txt").read_text())
    assert topo is not None and topo.devices == ("GPU0",)
    assert topo.cpu_affinity == {"GPU0": "0-15"}
    for letter in "rwnap":
        p2p = parse_p2p_matrix((H200X1 / f"topo-p2p-{letter}.txt").read_text())
        assert p2p is not None and p2p.gpu_link(0, 0) == "X"
    two = parse_p2p_matrix(P2P_TEMPLATE.format(ab="NS", ba="CNS"))
    assert two is not None and two.gpu_link(0, 1) == "NS" and two.gpu_link(1, 0) == "CNS"


def test_topo_with_a_nic_and_a_host_bridge_pair() -> None:
    text = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tPHB\tSYS\t0-15\t0\t\tN/A\n"
            "GPU1\tPHB\t X \tSYS\t16-31\t1\t\tN/A\n"
            "NIC0\tSYS\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n")
    topo = parse_topo_matrix(text)
    assert topo is not None and topo.devices == ("GPU0", "GPU1", "NIC0")
    assert topo.gpu_link(0, 1) == "PHB"
    assert topo.cpu_affinity["GPU1"] == "16-31" and topo.numa_affinity["GPU1"] == "1"


def test_no_matrix_is_none() -> None:
    assert parse_topo_matrix("NVIDIA-SMI has failed because it couldn't communicate") is None
    assert parse_topo_matrix("") is None


def test_smi_q_fields_of_both_gpus() -> None:
    log = parse_smi_q((H200X2 / "idle_q.out").read_text())
    assert log.driver is not None and log.driver.value == "580.159.04"
    assert log.cuda is not None and log.cuda.value == "13.0"
    assert [g.bus_id for g in log.gpus] == ["00000000:00:06.0", "00000000:00:07.0"]
    gpu1 = log.gpus[1]
    assert smi_int(gpu1.get("PCI/Replays Since Reset")) == 1
    assert smi_int(gpu1.get("PCI/GPU Link Info/Link Width/Current")) == 16
    assert smi_int(gpu1.get("PCI/GPU Link Info/PCIe Generation/Max")) == 5
    assert smi_bool(gpu1.get("Persistence Mode")) is True
    assert smi_bool(gpu1.get("Remapped Rows/Pending")) is False
    assert smi_bool(gpu1.get("Retired Pages/Pending Page Blacklist")) is None  # N/A
    assert smi_float(gpu1.get("GPU Power Readings/Default Power Limit")) == 700.0
    assert smi_float(gpu1.get("Module Power Readings/Default Power Limit")) is None
    assert smi_bool(gpu1.get("Clocks Event Reasons/Idle")) is True
    assert smi_bool(gpu1.get("Clocks Event Reasons/HW Slowdown")) is False
    assert smi_bool(gpu1.get("MIG Mode/Current")) is False


def test_smi_q_of_the_single_h200() -> None:
    log = parse_smi_q((H200X1 / "smi-q.txt").read_text())
    (gpu,) = log.gpus
    assert gpu.get("GPU UUID") is not None
    assert gpu.fields["Product Name"].value == "NVIDIA H200"
    assert smi_int(gpu.get("Temperature/GPU Current Temp")) == 40
    assert smi_int(gpu.get("ECC Errors/Volatile/DRAM Uncorrectable")) == 0
