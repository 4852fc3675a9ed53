"""The GPU backend registry.

A backend reads every GPU of a host and returns a :class:`~cleanslate.probe.snapshot.GpuReading`.
Backends are registered by the name users pass to ``--gpu-backend`` (``nvml``, ``nvidia-smi``,
``sim``, ``none``); ``auto`` picks the first one whose :meth:`GpuBackend.usable` is true, in
:data:`AUTO_ORDER`.

Contract of :meth:`GpuBackend.read`:
- it returns within ``timeout`` seconds (plus a small grace), whatever the driver does;
- it never raises for a GPU or driver problem: a failed or timed-out read is a reading with
  ``ok=False`` and the tool's own message in ``error``;
- a field the source could not give is ``None`` and named in ``Gpu.unknown_fields``, never 0.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import ClassVar

from cleanslate.errors import InputError
from cleanslate.hosts.base import Executor
from cleanslate.probe.snapshot import GpuReading

_REGISTRY: dict[str, type[GpuBackend]] = {}

#: The order in which ``--gpu-backend auto`` tries backends. ``sim`` comes first because it is
#: only usable when ``CLEANSLATE_SIM_GPU_DIR`` names a ledger, which a user sets on purpose.
AUTO_ORDER: tuple[str, ...] = ("sim", "nvml", "nvidia-smi", "none")

SIM_GPU_DIR_ENV = "CLEANSLATE_SIM_GPU_DIR"


class GpuBackend(ABC):
    """Reads the GPUs of one host. Subclasses register themselves with :func:`register`."""

    name: ClassVar[str]

    @abstractmethod
    async def read(self, executor: Executor, timeout: float) -> GpuReading:
        """Read every GPU of the executor's host. See the module docstring for the contract."""

    @classmethod
    async def usable(cls, executor: Executor) -> bool:
        """Whether ``auto`` should pick this backend on the executor's host."""
        return True


def register(cls: type[GpuBackend]) -> type[GpuBackend]:
    """Class decorator: make a backend selectable by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def backend_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Imported for their registration side effect; kept lazy so importing the probe stays cheap.
    from cleanslate.probe.gpu import none, nvidia_smi, nvml, sim  # noqa: F401


def get_backend(name: str) -> GpuBackend:
    """Return a backend instance by name (``auto`` is resolved by :func:`resolve_backend`)."""
    _load_builtin()
    try:
        return _REGISTRY[name]()
    except KeyError:
        choices = ", ".join(["auto", *sorted(_REGISTRY)])
        raise InputError(
            f"unknown GPU backend {name!r}", where="--gpu-backend", hint=f"choose one of {choices}"
        ) from None


async def resolve_backend(name: str, executor: Executor) -> GpuBackend:
    """Resolve ``auto`` to a concrete backend for this host; other names pass through."""
    if name != "auto":
        return get_backend(name)
    _load_builtin()
    for candidate in AUTO_ORDER:
        cls = _REGISTRY.get(candidate)
        if cls is not None and await cls.usable(executor):
            if candidate == "none":
                break
            return cls()
    from cleanslate.probe.gpu.none import NoGpuBackend

    return NoGpuBackend(auto_fallback=True)


def sim_gpu_dir() -> str | None:
    """The simulated GPU ledger named by ``CLEANSLATE_SIM_GPU_DIR``, if any."""
    value = os.environ.get(SIM_GPU_DIR_ENV)
    return value or None
