"""GPU backends: NVML, ``nvidia-smi``, the simulated GPU ledger, and none.

The contract and the registry are in :mod:`cleanslate.probe.gpu.base`; importing this package
registers the built-in backends (each module registers its class). ``pynvml`` is imported only
when the NVML backend is used.
"""

from __future__ import annotations

# The backend modules register their classes when imported.
from cleanslate.probe.gpu import none as none
from cleanslate.probe.gpu import nvidia_smi as nvidia_smi
from cleanslate.probe.gpu import nvml as nvml
from cleanslate.probe.gpu import sim as sim
from cleanslate.probe.gpu.base import (
    AUTO_ORDER,
    GpuBackend,
    backend_class,
    backend_names,
    get_backend,
    register,
    resolve_backend,
)

__all__ = [
    "AUTO_ORDER",
    "GpuBackend",
    "backend_class",
    "backend_names",
    "get_backend",
    "register",
    "resolve_backend",
]
