"""The NVML backend: the pure conversion on real dumps, and the read path with a replay of the
``pynvml`` module (see ``_pynvml_replay.py``)."""

from __future__ import annotations

import asyncio
import copy
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pynvml as real_pynvml
import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu import get_backend
from cleanslate.probe.gpu.nvidia_smi import reading_from_outputs
from cleanslate.probe.gpu.nvml import NvmlBackend, gpu_from_raw, reading_from_raw
from cleanslate.probe.snapshot import GpuReading

from ._data import UUID0, UUID1, nvml_dump, output
from ._pynvml_replay import ReplayNvml

GONE = {"nvml_error": "GpuIsLost", "message": "GPU is lost"}
UNSUPPORTED = {"nvml_error": "NotSupported", "message": "Not Supported"}

# --------------------------------------------------------------------------------- pure --------


def test_busy_dump() -> None:
    r = reading_from_raw(nvml_dump("busy_nvml"))
    assert r.ok, r.error
    assert r.backend == "nvml"
    assert r.driver_version == "580.159.04"
    assert r.note is None
    gpu0, gpu1 = r.gpus
    assert (gpu0.index, gpu0.uuid, gpu0.name) == (0, UUID0, "NVIDIA H200")
    assert gpu0.source == "nvml"
    assert gpu0.memory_used_mib == 41487
    assert gpu0.memory_total_mib == 143771
    assert gpu0.memory_reserved_mib == 616
    assert [(p.pid, p.used_mib) for p in gpu0.processes] == [(584, 41478)]
    assert gpu1.uuid == UUID1
    assert gpu1.memory_used_mib == 25627
    assert [(p.pid, p.used_mib) for p in gpu1.processes] == [(627, 20998), (665, 4614)]
    # The dump did not read ECC, row remapping or PCI: unknown, and not a health problem.
    for gpu in r.gpus:
        assert gpu.health == ()
        assert gpu.ecc_uncorrected is None
        assert set(gpu.unknown_fields) == {
            "pci_bus_id",
            "ecc_uncorrected",
            "retired_pages_pending",
            "remapped_rows_pending",
            "remapped_rows_failure",
        }


def test_orphans_dump_idle_gpu_reads_a_few_mib_not_the_reserved_618() -> None:
    dump = nvml_dump("orphans_nvml")
    assert dump["gpus"][0]["mem_v1"]["used"] == 648413184  # v1 counts reserved memory as used
    gpu0, gpu1 = reading_from_raw(dump).gpus
    assert gpu0.memory_used_mib is not None and gpu0.memory_used_mib <= 4
    assert gpu0.memory_reserved_mib == 616
    assert gpu0.processes == ()
    assert [p.pid for p in gpu1.processes] == [627, 665]
    assert gpu1.memory_used_mib == 25627


def test_nvml_and_nvidia_smi_agree_on_the_busy_state() -> None:
    nvml = reading_from_raw(nvml_dump("busy_nvml"))
    smi = reading_from_outputs(output("busy_query"), output("busy_apps"))
    for a, b in zip(nvml.gpus, smi.gpus, strict=True):
        assert (a.index, a.uuid, a.name) == (b.index, b.uuid, b.name)
        assert (a.memory_used_mib, a.memory_total_mib, a.memory_reserved_mib) == (
            b.memory_used_mib,
            b.memory_total_mib,
            b.memory_reserved_mib,
        )
        assert [(p.pid, p.used_mib) for p in a.processes] == [
            (p.pid, p.used_mib) for p in b.processes
        ]


def _gpu0(dump: str = "orphans_nvml") -> dict[str, Any]:
    record: dict[str, Any] = copy.deepcopy(nvml_dump(dump)["gpus"][0])
    return record


def test_v1_fallback_counts_reserved_as_used_and_says_so() -> None:
    record = _gpu0()
    record["mem_v2"] = {"nvml_error": "FunctionNotFound", "message": "Function Not Found"}
    r = reading_from_raw({"driver": "470.00", "gpus": [record]})
    assert r.ok
    gpu = r.gpus[0]
    assert gpu.memory_used_mib == 619  # 648413184 B: v1 includes driver-reserved memory
    assert gpu.memory_reserved_mib is None
    assert "memory_reserved_mib" in gpu.unknown_fields
    assert gpu.health == ()
    assert r.note is not None and "v2" in r.note and "includes driver-reserved" in r.note
    assert "Function Not Found" in r.note


def test_lost_gpu_on_memory_is_health_and_unknown() -> None:
    record = _gpu0()
    record["mem_v2"] = GONE
    record["mem_v1"] = GONE
    gpu = gpu_from_raw(record)
    assert gpu.memory_used_mib is None and gpu.memory_total_mib is None
    assert {"memory_used_mib", "memory_total_mib", "memory_reserved_mib"} <= set(gpu.unknown_fields)
    assert gpu.health == ("nvmlDeviceGetMemoryInfo: GPU is lost",)


def test_not_supported_is_unknown_but_not_health() -> None:
    record = _gpu0()
    record["ecc_uncorrected"] = UNSUPPORTED
    record["retired_pages_pending"] = UNSUPPORTED
    record["remapped_rows"] = {"corrected": 0, "uncorrected": 0, "pending": 0, "failure": 0}
    gpu = gpu_from_raw(record)
    assert gpu.ecc_uncorrected is None and gpu.retired_pages_pending is None
    assert {"ecc_uncorrected", "retired_pages_pending"} <= set(gpu.unknown_fields)
    assert gpu.remapped_rows_pending is False and gpu.remapped_rows_failure is False
    assert gpu.health == ()


def test_unknown_error_is_health_and_values_are_left_to_the_verdict() -> None:
    record = _gpu0()
    record["ecc_uncorrected"] = 2
    record["remapped_rows"] = {"nvml_error": "Unknown", "message": "Unknown Error"}
    gpu = gpu_from_raw(record)
    assert gpu.ecc_uncorrected == 2
    assert gpu.remapped_rows_pending is None and gpu.remapped_rows_failure is None
    assert {"remapped_rows_pending", "remapped_rows_failure"} <= set(gpu.unknown_fields)
    assert gpu.health == ("nvmlDeviceGetRemappedRows: Unknown Error",)


def test_gpu_without_handle_is_all_unknown_with_the_reason() -> None:
    gpu = gpu_from_raw({"index": 1, "handle": GONE})
    assert gpu.index == 1
    assert gpu.uuid is None and gpu.memory_used_mib is None
    assert "memory_used_mib" in gpu.unknown_fields and "processes" in gpu.unknown_fields
    assert gpu.health == ("nvmlDeviceGetHandleByIndex: GPU is lost",)


def test_process_memory_not_available_is_unknown() -> None:
    record = _gpu0("busy_nvml")
    record["procs"][0]["used"] = None  # pynvml's usedGpuMemory=None
    gpu = gpu_from_raw(record)
    assert gpu.processes[0].pid == 584
    assert gpu.processes[0].used_mib is None


def test_process_list_error_is_unknown() -> None:
    record = _gpu0("busy_nvml")
    record["procs"] = UNSUPPORTED
    gpu = gpu_from_raw(record)
    assert gpu.processes == ()
    assert "processes" in gpu.unknown_fields


def test_whole_failure_is_not_ok() -> None:
    r = reading_from_raw({"error": "NVML could not initialise: Driver Not Loaded"})
    assert not r.ok and r.error == "NVML could not initialise: Driver Not Loaded"
    assert not reading_from_raw({"driver": "x", "gpus": [{"uuid": "no index"}]}).ok


# ------------------------------------------------------------------- read path (replay) --------


@pytest.fixture
def no_nvml_threads() -> Iterator[None]:
    """Fail the test if it leaves an NVML worker thread running (and wait for a released one)."""
    yield
    deadline = time.monotonic() + 5
    while any(t.name == "cleanslate-nvml" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "an NVML worker thread is still running"
        time.sleep(0.01)


def read(timeout: float = 5.0) -> GpuReading:
    return asyncio.run(NvmlBackend().read(LocalExecutor(), timeout=timeout))


def use(monkeypatch: pytest.MonkeyPatch, fake: ReplayNvml) -> ReplayNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


HEALTHY = {"ecc": 0, "retired": 0, "remapped": (0, 0, 0, 0)}


def test_registered_under_its_name() -> None:
    assert isinstance(get_backend("nvml"), NvmlBackend)


@pytest.mark.usefixtures("no_nvml_threads")
def test_read_replayed_busy_host(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {
        0: {**HEALTHY, "pci": "00000000:00:06.0", "names": {584: "python3"}},
        1: {**HEALTHY, "pci": "00000000:00:07.0"},
    }
    fake = use(monkeypatch, ReplayNvml(nvml_dump("busy_nvml"), extra=extra))
    assert asyncio.run(NvmlBackend.usable(LocalExecutor())) is True
    r = read()
    assert r.ok, r.error
    assert fake.initialised == 0  # every nvmlInit was matched by nvmlShutdown
    assert r.elapsed_s > 0
    gpu0, gpu1 = r.gpus
    assert gpu0.unknown_fields == gpu1.unknown_fields == ()
    assert gpu0.health == gpu1.health == ()
    assert gpu0.pci_bus_id == "00000000:00:06.0"
    assert gpu0.name == "NVIDIA H200"  # the replay returns bytes, like older nvidia-ml-py
    assert [(p.pid, p.used_mib, p.name) for p in gpu0.processes] == [(584, 41478, "python3")]
    assert [(p.pid, p.name) for p in gpu1.processes] == [(627, None), (665, None)]
    assert (gpu0.ecc_uncorrected, gpu0.remapped_rows_pending, gpu0.retired_pages_pending) == (
        0,
        False,
        False,
    )
    # Same values as the pure conversion of the dump, plus what the replay added.
    pure = reading_from_raw(nvml_dump("busy_nvml"))
    assert [g.memory_used_mib for g in r.gpus] == [g.memory_used_mib for g in pure.gpus]


@pytest.mark.usefixtures("no_nvml_threads")
def test_read_without_v2_memory_falls_back_to_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, ReplayNvml(nvml_dump("orphans_nvml"), no_v2=True))
    r = read()
    assert r.ok
    assert r.gpus[0].memory_used_mib == 619
    assert r.note is not None and "includes driver-reserved" in r.note


@pytest.mark.usefixtures("no_nvml_threads")
def test_read_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fail = {(1, "nvmlDeviceGetHandleByIndex"): real_pynvml.NVMLError_GpuIsLost()}
    use(monkeypatch, ReplayNvml(nvml_dump("busy_nvml"), fail=fail))
    r = read()
    assert r.ok
    assert r.gpus[0].health == ()
    assert r.gpus[1].health == ("nvmlDeviceGetHandleByIndex: GPU is lost",)
    assert r.gpus[1].memory_used_mib is None


@pytest.mark.usefixtures("no_nvml_threads")
def test_python_error_in_one_call_loses_only_that_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    fail = {(0, "nvmlDeviceGetTotalEccErrors"): ctypes.ArgumentError("argument 3")}
    use(monkeypatch, ReplayNvml(nvml_dump("busy_nvml"), fail=fail, extra={0: HEALTHY}))
    gpu0 = read().gpus[0]
    assert gpu0.ecc_uncorrected is None and "ecc_uncorrected" in gpu0.unknown_fields
    assert gpu0.remapped_rows_pending is False
    assert gpu0.memory_used_mib == 41487


@pytest.mark.usefixtures("no_nvml_threads")
def test_hung_nvml_times_out_and_later_reads_do_not_pile_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    use(monkeypatch, ReplayNvml(nvml_dump("busy_nvml"), hang=release))
    try:
        start = time.monotonic()
        r = read(timeout=0.3)
        assert time.monotonic() - start < 1.5
        assert not r.ok
        assert r.error == "NVML did not answer within 0.3 s"
        # While the first call is stuck, a new read answers at once instead of adding a thread.
        again = read(timeout=5)
        assert not again.ok
        assert again.error is not None and "has not returned" in again.error
        assert asyncio.run(NvmlBackend.usable(LocalExecutor())) is False
        assert sum(t.name == "cleanslate-nvml" for t in threading.enumerate()) == 1
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while any(t.name == "cleanslate-nvml" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert read().ok  # once NVML answers again, so does the backend


@pytest.mark.usefixtures("no_nvml_threads")
def test_nvml_init_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    error = real_pynvml.NVMLError_LibraryNotFound()
    use(monkeypatch, ReplayNvml(nvml_dump("busy_nvml"), init_error=error))
    assert asyncio.run(NvmlBackend.usable(LocalExecutor())) is False
    r = read()
    assert not r.ok
    assert r.error == "NVML could not initialise: NVML Shared Library Not Found"


class RemoteExecutor(LocalExecutor):
    """Stands for a remote host: NVML must refuse it whatever runs underneath."""

    name = "user@gpu-host"
    is_local = False


def test_not_for_remote_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, ReplayNvml(nvml_dump("busy_nvml")))
    assert asyncio.run(NvmlBackend.usable(RemoteExecutor())) is False
    r = asyncio.run(NvmlBackend().read(RemoteExecutor(), timeout=5))
    assert not r.ok
    assert r.error is not None and "user@gpu-host" in r.error and "nvidia-smi" in r.error


@pytest.mark.usefixtures("no_nvml_threads")
def test_real_library_without_a_driver_is_unusable() -> None:
    """On a machine without the NVIDIA driver, the real nvidia-ml-py fails in nvmlInit."""
    try:
        real_pynvml.nvmlInit()
    except real_pynvml.NVMLError:
        pass
    else:
        real_pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    assert asyncio.run(NvmlBackend.usable(LocalExecutor())) is False
    r = read()
    assert not r.ok
    assert r.error is not None and r.error.startswith("NVML could not initialise")
