"""The GPU backend contract and its registry.

A backend reads every GPU of a host and returns a :class:`~cleanslate.probe.snapshot.GpuReading`.
Backends are registered by the name users pass to ``--gpu-backend`` (``nvml``, ``nvidia-smi``,
``sim``, ``none``; :mod:`cleanslate.probe.gpu` registers the built-in ones); ``auto`` picks the
first one whose :meth:`GpuBackend.usable` is true, in :data:`AUTO_ORDER`. This module imports
no backend: a backend module imports it and registers itself.

Contract of :meth:`GpuBackend.read` (``tests/probe/gpu/test_contract.py`` runs it on every
built-in backend):
- it returns within ``timeout`` seconds (plus a small grace), whatever the driver does;
- it never raises for a GPU or driver problem: a failed or timed-out read is a reading with
  ``ok=False`` and the tool's own message in ``error``;
- a field the source could not give is ``None`` and named in ``Gpu.unknown_fields``, never 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, TypeVar

from cleanslate._types import Registry
from cleanslate.errors import InputError
from cleanslate.hosts.base import Executor
from cleanslate.probe.snapshot import GpuReading

_REGISTRY: Registry[type[GpuBackend]] = Registry("GPU backend")

#: The order in which ``--gpu-backend auto`` tries backends. ``sim`` comes first because it is
#: only usable when ``CLEANSLATE_SIM_GPU_DIR`` names a ledger, which a user sets on purpose.
AUTO_ORDER: tuple[str, ...] = ("sim", "nvml", "nvidia-smi", "none")


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

    @classmethod
    def for_env(cls, env: Mapping[str, str] | None = None) -> GpuBackend:
        """An instance that reads what a run with environment ``env`` uses (``None``: this
        process's environment). The base ignores ``env``; the ``sim`` backend finds its ledger
        there."""
        return cls()

    @classmethod
    def for_auto(cls) -> GpuBackend:
        """The instance ``auto`` uses when it picks this backend (``none`` says that it was a
        fallback)."""
        return cls()


B = TypeVar("B", bound=type[GpuBackend])


def register(cls: B) -> B:
    """Class decorator: make a backend selectable by its ``name``. Raises :class:`ValueError`
    when another class has that name."""
    _REGISTRY.add(cls.name, cls)
    return cls


def backend_names() -> list[str]:
    """The registered backend names, sorted (``auto`` is not one)."""
    return sorted(_REGISTRY)


def backend_class(name: str) -> type[GpuBackend]:
    """The backend class registered as ``name``; an :class:`InputError` for an unknown name."""
    try:
        return _REGISTRY[name]
    except KeyError:
        choices = ", ".join(["auto", *sorted(_REGISTRY)])
        raise InputError(
            f"unknown GPU backend {name!r}", where="--gpu-backend", hint=f"choose one of {choices}"
        ) from None


def get_backend(name: str, env: Mapping[str, str] | None = None) -> GpuBackend:
    """A backend instance by name (``auto`` is resolved by :func:`resolve_backend`). ``env``: the
    environment of the run whose GPUs it reads (see :meth:`GpuBackend.for_env`)."""
    return backend_class(name).for_env(env)


async def resolve_backend(name: str | GpuBackend, executor: Executor) -> GpuBackend:
    """Resolve ``auto`` to a concrete backend for this host; other names pass through, and so
    does a backend instance (one already configured for a run)."""
    if isinstance(name, GpuBackend):
        return name
    if name != "auto":
        return get_backend(name)
    for candidate in AUTO_ORDER:
        cls = _REGISTRY.get(candidate)
        if cls is not None and await cls.usable(executor):
            return cls.for_auto()
    raise InputError("no GPU backend is usable on this host", where="--gpu-backend",
                     hint="choose one of " + ", ".join(sorted(_REGISTRY)))
