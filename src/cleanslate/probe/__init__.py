"""What is on a host: processes, GPUs, device files, listeners, ``/dev/shm``, kernel events.

- :mod:`~cleanslate.probe.host`: :func:`probe_host`, one reading of one host (the collector and
  a GPU backend, concurrently, each with its own timeout) as a frozen :class:`Snapshot`.
- :mod:`~cleanslate.probe.collect`: the stdlib-only collector, shipped to the host's
  ``python3`` and run as a child with a timeout, locally or over SSH;
  :mod:`~cleanslate.probe.fallback` reads the same with ``ps`` and ``ls`` where there is no
  ``python3``.
- :mod:`~cleanslate.probe.gpu`: the GPU backends (NVML, ``nvidia-smi``, the sim ledger, none).
- :mod:`~cleanslate.probe.snapshot`: the snapshot's value objects; every source says whether it
  was read, and what could not be read is never a zero.

The names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.probe.collect import run_collector
    from cleanslate.probe.host import DEFAULT_TIMEOUT_S, probe_host
    from cleanslate.probe.snapshot import (
        DeviceHolder,
        Gpu,
        GpuProcess,
        GpuReading,
        KernelEvent,
        ListeningSocket,
        ProcessInfo,
        ShmEntry,
        Snapshot,
        SourceStatus,
    )

__getattr__, __dir__ = lazy_exports(__name__, {
    "DEFAULT_TIMEOUT_S": "cleanslate.probe.host",
    "probe_host": "cleanslate.probe.host",
    "DeviceHolder": "cleanslate.probe.snapshot",
    "Gpu": "cleanslate.probe.snapshot",
    "GpuProcess": "cleanslate.probe.snapshot",
    "GpuReading": "cleanslate.probe.snapshot",
    "KernelEvent": "cleanslate.probe.snapshot",
    "ListeningSocket": "cleanslate.probe.snapshot",
    "ProcessInfo": "cleanslate.probe.snapshot",
    "ShmEntry": "cleanslate.probe.snapshot",
    "Snapshot": "cleanslate.probe.snapshot",
    "SourceStatus": "cleanslate.probe.snapshot",
    "run_collector": "cleanslate.probe.collect",
})

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DeviceHolder",
    "Gpu",
    "GpuProcess",
    "GpuReading",
    "KernelEvent",
    "ListeningSocket",
    "ProcessInfo",
    "ShmEntry",
    "Snapshot",
    "SourceStatus",
    "probe_host",
    "run_collector",
]
