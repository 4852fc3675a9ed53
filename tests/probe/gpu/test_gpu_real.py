"""Both backends on the real GPUs of this machine (marked ``gpu``: run on the accelerator host).

Skipped where ``nvidia-smi`` is not on ``PATH`` or NVML cannot initialise.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.nvidia_smi import NvidiaSmiBackend
from cleanslate.probe.gpu.nvml import NvmlBackend
from cleanslate.probe.snapshot import GpuReading

#: How far the two backends' memory readings may differ: they are two reads at two moments,
#: and ``nvidia-smi`` prints an idle H200 as 0 MiB where NVML v2 says 3-4 MiB.
TOLERANCE_MIB = 64


def _have_gpus() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return asyncio.run(NvmlBackend.usable(LocalExecutor()))


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _have_gpus(), reason="needs nvidia-smi and NVML (an NVIDIA GPU)"),
]


def read_both() -> tuple[GpuReading, GpuReading]:
    async def both() -> tuple[GpuReading, GpuReading]:
        executor = LocalExecutor()
        smi = await NvidiaSmiBackend().read(executor, timeout=30)
        nvml = await NvmlBackend().read(executor, timeout=30)
        return smi, nvml

    return asyncio.run(both())


def test_usable_here() -> None:
    executor = LocalExecutor()
    assert asyncio.run(NvidiaSmiBackend.usable(executor))
    assert asyncio.run(NvmlBackend.usable(executor))


def test_backends_agree_on_count_uuids_and_memory() -> None:
    smi, nvml = read_both()
    assert smi.ok, smi.error
    assert nvml.ok, nvml.error
    assert smi.gpus, "nvidia-smi listed no GPU"
    assert [g.index for g in smi.gpus] == [g.index for g in nvml.gpus]
    assert [g.uuid for g in smi.gpus] == [g.uuid for g in nvml.gpus]
    assert smi.driver_version == nvml.driver_version
    for a, b in zip(smi.gpus, nvml.gpus, strict=True):
        assert a.name == b.name
        assert a.pci_bus_id is not None and b.pci_bus_id is not None
        assert a.pci_bus_id.lower() == b.pci_bus_id.lower()
        assert a.memory_total_mib == b.memory_total_mib
        assert a.memory_used_mib is not None and b.memory_used_mib is not None
        assert abs(a.memory_used_mib - b.memory_used_mib) <= TOLERANCE_MIB, (a, b)
        if a.memory_reserved_mib is not None and b.memory_reserved_mib is not None:
            assert abs(a.memory_reserved_mib - b.memory_reserved_mib) <= 2
        for field in ("ecc_uncorrected", "remapped_rows_pending", "remapped_rows_failure"):
            assert getattr(a, field) == getattr(b, field), field
        assert {p.pid for p in a.processes} == {p.pid for p in b.processes}


HOLDER = """
import sys, time, torch
x = torch.empty(int(sys.argv[1]) * 2**20, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def gpu_holder() -> Iterator[subprocess.Popen[str]]:
    """A process that holds 2 GiB on GPU 0; ended by PID when the test ends."""
    pytest.importorskip("torch")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "2048"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_process_holding_memory_is_seen_by_both(gpu_holder: subprocess.Popen[str]) -> None:
    smi, nvml = read_both()
    for reading in (smi, nvml):
        assert reading.ok, reading.error
        held = {p.pid: p for p in reading.gpus[0].processes}
        assert gpu_holder.pid in held, (reading.backend, held)
        used = held[gpu_holder.pid].used_mib
        assert used is not None and used >= 2048, (reading.backend, used)
        gpu0_used = reading.gpus[0].memory_used_mib
        assert gpu0_used is not None and gpu0_used >= 2048
    gpu_holder.kill()
    gpu_holder.wait(timeout=30)
    deadline = time.monotonic() + 30  # memory is released asynchronously after a kill
    while True:
        smi, nvml = read_both()
        pids = {p.pid for r in (smi, nvml) for g in r.gpus for p in g.processes}
        if gpu_holder.pid not in pids:
            break
        assert time.monotonic() < deadline, "the killed process still holds GPU memory"
        time.sleep(0.2)
