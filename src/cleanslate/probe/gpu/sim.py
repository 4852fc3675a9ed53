"""The ``sim`` backend: reads the simulated GPU ledger of the simulated engine.

The ledger (a directory named by ``CLEANSLATE_SIM_GPU_DIR``) stands in for the driver: each
simulated worker records the memory it holds on its GPU, and the reader counts an entry while
its owning process exists (see :mod:`cleanslate.sim.ledger` for the format and semantics).

Like a remote probe, the reader is a stdlib-only script whose source is sent to the host's
Python (:func:`cleanslate.hosts.run_script`: on stdin, with the directory as its argument); its
JSON answer becomes a
:class:`~cleanslate.probe.snapshot.GpuReading` with ``source="sim"``. The equivalent by hand:
``python -m cleanslate.sim.ledger $CLEANSLATE_SIM_GPU_DIR`` (or ``cleanslate sim gpus``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TypedDict

from cleanslate.hosts.base import Executor
from cleanslate.hosts.scripts import run_script, script_source
from cleanslate.probe.gpu.base import GpuBackend, register
from cleanslate.probe.snapshot import Gpu, GpuProcess, GpuReading
from cleanslate.sim.ledger import SIM_GPU_DIR_ENV, ledger_dir

#: The stdlib-only ledger reader (:mod:`cleanslate.sim.ledger`) sent to the host.
LEDGER_SCRIPT = "sim.ledger"


class LedgerProcess(TypedDict, total=False):
    pid: int
    used_mib: int
    name: str | None


class LedgerGpu(TypedDict, total=False):
    index: int
    name: str | None
    memory_used_mib: int
    memory_total_mib: int
    releasing_mib: int
    processes: list[LedgerProcess]


class LedgerOutput(TypedDict, total=False):
    """What the reader prints (:func:`cleanslate.sim.ledger.read_ledger`)."""

    ok: bool
    error: str
    directory: str
    gpus: list[LedgerGpu]
    note: str


def ledger_source() -> str:
    """The source of the stdlib-only ledger reader that is sent to the host."""
    return script_source(LEDGER_SCRIPT).decode()


def reading_from_json(payload: LedgerOutput, elapsed_s: float) -> GpuReading:
    """Turn the reader's JSON into a reading (``ok=False`` with its error when it failed)."""
    if not payload.get("ok"):
        return GpuReading(
            backend="sim",
            ok=False,
            error=str(payload.get("error") or "the simulated GPU ledger reader failed"),
            elapsed_s=elapsed_s,
        )
    directory = str(payload.get("directory") or "")
    gpus = []
    for g in payload.get("gpus", []):
        index = int(g["index"])
        gpus.append(
            Gpu(
                index=index,
                uuid=f"GPU-sim-{index:08d}",
                name=g.get("name"),
                pci_bus_id=f"00000000:{index + 0x18:02X}:00.0",
                memory_used_mib=int(g["memory_used_mib"]),
                memory_total_mib=int(g["memory_total_mib"]),
                memory_reserved_mib=0,
                processes=tuple(
                    GpuProcess(pid=int(p["pid"]), used_mib=int(p["used_mib"]), name=p.get("name"))
                    for p in g.get("processes", [])
                ),
                ecc_uncorrected=0,
                retired_pages_pending=False,
                remapped_rows_pending=False,
                remapped_rows_failure=False,
                source="sim",
            )
        )
    note = f"simulated GPUs from the ledger {directory}"
    if payload.get("note"):
        note += f" ({payload['note']})"
    return GpuReading(
        backend="sim",
        ok=True,
        gpus=tuple(gpus),
        driver_version="sim",
        note=note,
        elapsed_s=elapsed_s,
    )


@register
class SimGpuBackend(GpuBackend):
    """Reads the simulated GPU ledger: ``directory``, else the one ``CLEANSLATE_SIM_GPU_DIR``
    names when it reads (``auto`` picks it only when that variable is set)."""

    name = "sim"

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory

    @classmethod
    async def usable(cls, executor: Executor) -> bool:
        return ledger_dir() is not None

    @classmethod
    def for_env(cls, env: Mapping[str, str] | None = None) -> SimGpuBackend:
        """The ledger a run with environment ``env`` writes to (``None``, or an ``env`` that
        names none: the one this process's environment names when it reads)."""
        return cls(ledger_dir(env) if env is not None else None)

    async def read(self, executor: Executor, timeout: float) -> GpuReading:
        start = time.monotonic()
        directory = self.directory or ledger_dir()
        if directory is None:
            return GpuReading(
                backend=self.name,
                ok=False,
                error=f"{SIM_GPU_DIR_ENV} is not set: there is no simulated GPU ledger to read",
            )
        try:
            # The source on stdin, as the collector's: in argv it would be in the command line
            # of a process the concurrent collector lists, which the checker then redacts and
            # matches against every engine signature (a quarter of its CPU time per host).
            done = await run_script(executor, LEDGER_SCRIPT, directory, timeout,
                                    output=LedgerOutput,
                                    what="the simulated GPU ledger reader")
        except OSError as exc:
            return GpuReading(
                backend=self.name,
                ok=False,
                error=f"cannot reach {executor.name}: {exc}",
                elapsed_s=time.monotonic() - start,
            )
        elapsed = time.monotonic() - start
        if done.output is None:
            return GpuReading(
                backend=self.name, ok=False, error=done.describe_failure(), elapsed_s=elapsed
            )
        try:
            return reading_from_json(done.output, elapsed)
        except (ValueError, KeyError, TypeError) as exc:
            return GpuReading(
                backend=self.name,
                ok=False,
                error=f"unparsable simulated GPU ledger output: {exc}",
                elapsed_s=elapsed,
            )
