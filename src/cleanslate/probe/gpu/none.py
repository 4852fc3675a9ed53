"""The ``none`` backend: no GPU state is read (CPU-only hosts, or by choice)."""

from __future__ import annotations

from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.base import GpuBackend, register
from cleanslate.probe.snapshot import GpuReading


@register
class NoGpuBackend(GpuBackend):
    """Reports no GPUs. ``auto`` falls back to it when no other backend is usable, and says so
    in the reading's ``note`` so a user never mistakes "not read" for "idle"."""

    name = "none"

    def __init__(self, *, auto_fallback: bool = False) -> None:
        #: Chosen by ``auto`` because no other backend was usable (not by the user): the
        #: verdict is UNKNOWN where the host has NVIDIA devices (``Snapshot.gpu_devices``).
        self.auto_fallback = auto_fallback

    async def read(self, executor: Executor, timeout: float) -> GpuReading:
        return GpuReading(
            backend=self.name,
            ok=True,
            note="no GPU backend in use: GPU memory and health were not read"
                 + (" (auto: no other backend was usable on this host)"
                    if self.auto_fallback else ""),
            auto_fallback=self.auto_fallback,
        )

    @classmethod
    def for_auto(cls) -> NoGpuBackend:
        return cls(auto_fallback=True)
