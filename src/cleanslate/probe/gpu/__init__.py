"""GPU backends: NVML, ``nvidia-smi``, the simulated GPU ledger, and none."""

from __future__ import annotations

from cleanslate.probe.gpu.base import (
    AUTO_ORDER,
    GpuBackend,
    backend_names,
    get_backend,
    register,
    resolve_backend,
)

__all__ = [
    "AUTO_ORDER",
    "GpuBackend",
    "backend_names",
    "get_backend",
    "register",
    "resolve_backend",
]
