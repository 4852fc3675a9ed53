"""The GPU backend contract, as a check a test suite runs on every backend.

``tests/probe/gpu/test_contract.py`` runs :func:`check_read` on the NVML backend (over a replay
of ``pynvml``), the ``nvidia-smi`` backend (over stand-in scripts replaying real outputs), the
simulated ledger and ``none``, each answering well and failing. A backend written outside
cleanslate can be held to the same contract::

    reading = asyncio.run(check_read(MyBackend(), LocalExecutor(), timeout=2.0, ok=True))

The contract (:mod:`cleanslate.probe.gpu.base`): :meth:`~GpuBackend.read` returns within its
timeout (plus :data:`GRACE_S`) whatever the driver does and never raises; a failed read is a
reading with ``ok=False`` and an error; a field the source could not give is ``None`` and named
in ``Gpu.unknown_fields``, and a named field is not given.
"""

from __future__ import annotations

import time

from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.base import GpuBackend
from cleanslate.probe.snapshot import Gpu, GpuReading

#: Seconds a read may take beyond its timeout (the probe's own bound adds 2 s).
GRACE_S = 1.5

#: The fields of :class:`Gpu` a backend may not know: ``None`` exactly when named unknown.
OPTIONAL_FIELDS: tuple[str, ...] = (
    "uuid", "name", "pci_bus_id", "memory_used_mib", "memory_total_mib", "memory_reserved_mib",
    "ecc_uncorrected", "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure",
)  # fmt: skip


def check_gpu(gpu: Gpu, backend: str) -> None:
    """One GPU of a reading: it says its source, and what is unknown is ``None`` (or an empty
    process list) exactly when it is named in ``unknown_fields``."""
    assert gpu.source == backend, f"GPU {gpu.index}: source {gpu.source!r}, not {backend!r}"
    fields = set(Gpu.model_fields)
    for name in gpu.unknown_fields:
        assert name in fields, f"GPU {gpu.index}: unknown field {name!r} is not a GPU field"
        value = getattr(gpu, name)
        assert value is None or value == (), f"GPU {gpu.index}: {name} is named unknown " \
                                             f"but reads {value!r}"
    for name in OPTIONAL_FIELDS:
        if getattr(gpu, name) is None:
            assert name in gpu.unknown_fields, f"GPU {gpu.index}: {name} is None, not named"


def check_reading(reading: GpuReading, backend: GpuBackend) -> None:
    """A reading names its backend; a failed one says why; GPUs have distinct indices and keep
    :func:`check_gpu`."""
    assert isinstance(reading, GpuReading), f"{backend.name}: read returned {reading!r}"
    assert reading.backend == backend.name, f"{backend.name}: reading of {reading.backend!r}"
    if not reading.ok:
        assert isinstance(reading.error, str) and reading.error.strip(), (
            f"{backend.name}: a failed reading without an error")
    indices = [g.index for g in reading.gpus]
    assert len(set(indices)) == len(indices), f"{backend.name}: GPU indices {indices}"
    for gpu in reading.gpus:
        check_gpu(gpu, backend.name)


async def check_read(backend: GpuBackend, executor: Executor, *, timeout: float,
                     ok: bool) -> GpuReading:
    """Read once and hold the reading to the contract: no exception, within ``timeout`` plus
    :data:`GRACE_S`, ``ok`` as expected, :func:`check_reading`. Returns the reading."""
    started = time.monotonic()
    try:
        reading = await backend.read(executor, timeout)
    except Exception as exc:
        raise AssertionError(f"{backend.name}: read raised {type(exc).__name__}: {exc}") from exc
    elapsed = time.monotonic() - started
    assert elapsed <= timeout + GRACE_S, (
        f"{backend.name}: read took {elapsed:.2f} s with a timeout of {timeout:g} s")
    check_reading(reading, backend)
    assert reading.ok is ok, f"{backend.name}: ok={reading.ok} ({reading.error})"
    return reading
