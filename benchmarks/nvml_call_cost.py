"""What each NVML call of the GPU telemetry sampler costs on this machine (wall and CPU time
of the calling thread, median of N calls), and whether the PCIe byte counters (field values)
answer here. Run on the GPU machine: ``python3 benchmarks/nvml_call_cost.py [N]``; prints one
line per call. The sampler's own cost per sample is in each level's ``sampler_cpu_ms``."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def cost(fn: Callable[[], Any], n: int) -> tuple[float, float, str]:
    walls: list[float] = []
    cpus: list[float] = []
    result = ""
    for _ in range(n):
        w, c = time.perf_counter(), time.thread_time()
        try:
            value = fn()
            result = repr(value)[:60]
        except Exception as exc:
            result = f"{type(exc).__name__}: {exc}"[:60]
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    return 1000 * statistics.median(walls), 1000 * statistics.median(cpus), result


def main() -> None:
    import pynvml as nv

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
    fields = [nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
    calls: dict[str, Callable[[], Any]] = {
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
        "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h).used,
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "sm clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "mem clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "max sm clock": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "clock events": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "pcie throughput rx": lambda: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_RX_BYTES),
        "pcie field counters": lambda: [(v.nvmlReturn, v.value.ullVal) for v in
                                        nv.nvmlDeviceGetFieldValues(h, fields)],
        "gpm sample": lambda: nv.nvmlGpmSampleGet(h, gpm[0]),
        "xid event wait": lambda: nv.nvmlEventSetWait_v2(events, 0),
    }
    events = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
    print(f"NVML call costs, median of {n} calls (ms wall, ms CPU of the calling thread)")
    for name, fn in calls.items():
        wall, cpu, result = cost(fn, n)
        print(f"{name:22s} {wall:8.3f} {cpu:8.3f}  {result}")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
