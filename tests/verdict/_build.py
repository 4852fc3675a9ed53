"""Small snapshots for the verdict rules' tests: one GPU, a reading of GPUs, one process, and a
snapshot of a host holding them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cleanslate.probe.snapshot import Gpu, GpuProcess, GpuReading, ProcessInfo, Snapshot


def snapshot(gpu: GpuReading, processes: Sequence[ProcessInfo] = (), **extra: Any) -> Snapshot:
    return Snapshot(host="h200x2", taken_at="2026-11-30T13:05:39Z", elapsed_s=0.1,
                    processes=tuple(processes), gpu=gpu, **extra)


def gpu(index: int = 0, used: int | None = 3, procs: Sequence[GpuProcess] = (),
        **kw: Any) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index}", name="NVIDIA H200", memory_used_mib=used,
               memory_total_mib=143771, processes=tuple(procs), source="test", **kw)


def reading(*gpus: Gpu) -> GpuReading:
    return GpuReading(backend="test", ok=True, gpus=tuple(gpus))


def proc(pid: int, comm: str = "python3", cmdline: Sequence[str] = ("python3",),
         **kw: Any) -> ProcessInfo:
    fields: dict[str, Any] = {"ppid": 1, "pgid": pid, "sid": pid, "state": "S",
                              "create_time": 1.0, "environ_readable": True, **kw}
    return ProcessInfo(pid=pid, comm=comm, cmdline=tuple(cmdline), **fields)
