"""A compact doctor snapshot of a host: what a study or a ``serve`` run records about the
machine it ran on (``docs/doctor.md``, "Snapshots").

:func:`snapshot_host` runs the doctor's host script (quick mode: no ``--bandwidth``) through
the executor with one deadline for the whole probe and turns its report into a
:class:`HostSnapshot`: driver and CUDA versions, one row per GPU, the pairs' links and P2P
status, the machine around them (VM, container, kernel, ``/dev/shm``) and the findings with
their consequence. It never raises for anything the host does (only ``CancelledError`` goes
on): a probe that fails, times out or prints nonsense is a snapshot with ``error`` saying why,
so recording a snapshot can never fail a study or a server.

A snapshot is bounded: at most :data:`MAX_GPUS` GPUs, :data:`MAX_PAIRS` pairs,
:data:`MAX_FINDINGS` findings with :data:`MAX_EVIDENCE` evidence lines each, and every text
cut at :data:`MAX_TEXT` characters; ``truncated`` names what was cut. Its layout has a
``version`` (:data:`SNAPSHOT_VERSION`); a snapshot of a newer version does not validate.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import field_validator

from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.report import Device, DoctorFinding, DoctorSeverity, HostDoctor, Pair
from cleanslate.doctor.run import run_script
from cleanslate.hosts.base import Executor
from cleanslate.models import FrozenStrict
from cleanslate.redact import redact_data

#: The layout of :class:`HostSnapshot`. 1: the first.
SNAPSHOT_VERSION = 1
#: Seconds the whole probe may take on a host by default (the script, every ``nvidia-smi``
#: command within it, the connection): a quick doctor takes 0.1-0.5 s on a healthy host.
SNAPSHOT_TIMEOUT_S = 30.0
#: Environment variable overriding :data:`SNAPSHOT_TIMEOUT_S` (seconds, above 0).
SNAPSHOT_TIMEOUT_ENV = "CLEANSLATE_DOCTOR_SNAPSHOT_TIMEOUT_S"
#: Bounds of a snapshot.
MAX_GPUS, MAX_PAIRS, MAX_FINDINGS, MAX_EVIDENCE, MAX_TEXT = 64, 256, 64, 3, 400


#: The order of findings in a snapshot.
_RANK = {DoctorSeverity.ERROR: 0, DoctorSeverity.WARNING: 1, DoctorSeverity.INFO: 2}


def _cut(value: str | None, limit: int = MAX_TEXT) -> str | None:
    if value is None:
        return None
    return value if len(value) <= limit else value[: limit - 3] + "..."


class GpuRow(FrozenStrict):
    """One GPU as a snapshot keeps it. ``None`` is "not read" (never 0); PCIe figures are the
    current link against its maximum (``pcie_gen`` of ``pcie_gen_max``, ``pcie_width`` of
    ``pcie_width_max``); ``memory_problems`` names pending retired pages, pending row remaps
    and a remapping failure; ``clock_events`` are the active clock-event (throttle) reasons."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    persistence: bool | None = None
    mig: bool | None = None
    ecc: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    memory_problems: tuple[str, ...] = ()
    clock_events: tuple[str, ...] | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None

    @classmethod
    def of(cls, device: Device) -> GpuRow:
        problems = tuple(label for label, flag in (
            ("retired pages pending", device.retired_pages_pending),
            ("row remap pending", device.remapped_rows_pending),
            ("row remapping failed", device.remapped_rows_failure)) if flag)
        return cls(
            index=device.index, name=_cut(device.name), uuid=_cut(device.uuid),
            pci_bus_id=_cut(device.pci_bus_id), pcie_gen=device.pcie_gen,
            pcie_gen_max=device.pcie_gen_max, pcie_width=device.pcie_width,
            pcie_width_max=device.pcie_width_max, persistence=device.persistence,
            mig=device.mig, ecc=device.ecc,
            ecc_uncorrected_volatile=device.ecc_uncorrected_volatile,
            memory_problems=problems,
            clock_events=None if device.clock_event_reasons is None else tuple(
                str(_cut(r, 80)) for r in device.clock_event_reasons[:16]),
            power_limit_w=device.power_limit_w, power_default_w=device.power_default_w)

    def pcie_text(self) -> str:
        """``gen 5 x16 of gen 5 x16``; ``?`` for a part not read."""
        def show(value: int | None) -> str:
            return "?" if value is None else str(value)

        return (f"gen {show(self.pcie_gen)} x{show(self.pcie_width)} of gen "
                f"{show(self.pcie_gen_max)} x{show(self.pcie_width_max)}")


class PairRow(FrozenStrict):
    """Two GPUs: the link ``topo -m`` names (``NV18``, ``PHB``, ``SYS`` ...) and P2P read and
    write status (``OK``, ``NS`` ...); ``None``: not read."""

    a: int
    b: int
    link: str | None = None
    p2p_read: str | None = None
    p2p_write: str | None = None

    @classmethod
    def of(cls, pair: Pair) -> PairRow:
        return cls(a=pair.a, b=pair.b, link=_cut(pair.link, 40),
                   p2p_read=_cut(pair.p2p_read, 40), p2p_write=_cut(pair.p2p_write, 40))


class SnapshotFinding(FrozenStrict):
    """A doctor finding as a snapshot keeps it: severity, the message (its title), what it
    means for serving, the GPUs it is about, and its first evidence lines."""

    code: str
    severity: DoctorSeverity
    message: str
    consequence: str
    gpus: tuple[int, ...] = ()
    evidence: tuple[str, ...] = ()

    @classmethod
    def of(cls, finding: DoctorFinding) -> SnapshotFinding:
        return cls(code=str(_cut(finding.code, 80)), severity=finding.severity,
                   message=str(_cut(finding.message)),
                   consequence=str(_cut(finding.consequence)), gpus=finding.gpus[:MAX_GPUS],
                   evidence=tuple(str(_cut(e)) for e in finding.evidence[:MAX_EVIDENCE]))


class HostSnapshot(FrozenStrict):
    """A compact doctor report of one host at one moment (epoch seconds ``taken_at``;
    ``elapsed_s`` is how long the probe took).

    ``error`` set: the probe did not give a report (why: unreachable, timed out, no
    ``python3``, no JSON), and the other sections are empty. ``driver_present`` false: no
    NVIDIA driver (not a problem; the environment is still read). ``shm_bytes`` is the size
    of ``/dev/shm`` in bytes. ``truncated`` names the sections that were cut to the bounds.
    """

    version: int = SNAPSHOT_VERSION
    host: str
    taken_at: float
    elapsed_s: float
    error: str | None = None
    driver_present: bool | None = None
    driver: str | None = None
    cuda: str | None = None
    gpus: tuple[GpuRow, ...] = ()
    pairs: tuple[PairRow, ...] = ()
    virtualization: str | None = None
    container: str | None = None
    kernel: str | None = None
    shm_bytes: int | None = None
    findings: tuple[SnapshotFinding, ...] = ()
    truncated: tuple[str, ...] = ()

    @field_validator("version")
    @classmethod
    def _known(cls, version: int) -> int:
        if version > SNAPSHOT_VERSION:
            raise ValueError(f"a host snapshot of version {version} (this cleanslate reads up "
                             f"to {SNAPSHOT_VERSION})")
        return version

    @classmethod
    def of(cls, report: HostDoctor, *, taken_at: float | None = None) -> HostSnapshot:
        """The compact form of a doctor report (its bandwidth section, if any, left out); the
        findings errors first, then warnings, then info (so that a cut keeps the errors)."""
        env = report.environment
        truncated = [what for what, items, limit in (
            ("gpus", report.devices, MAX_GPUS), ("pairs", report.pairs, MAX_PAIRS),
            ("findings", report.findings, MAX_FINDINGS)) if len(items) > limit]
        return cls(
            host=report.host, taken_at=time.time() if taken_at is None else taken_at,
            elapsed_s=report.elapsed_s, error=_cut(report.error),
            driver_present=report.driver.present if report.driver else None,
            driver=_cut(report.driver.version, 80) if report.driver else None,
            cuda=_cut(report.driver.cuda, 80) if report.driver else None,
            gpus=tuple(GpuRow.of(d) for d in report.devices[:MAX_GPUS]),
            pairs=tuple(PairRow.of(p) for p in report.pairs[:MAX_PAIRS]),
            virtualization=_cut(env.virtualization, 80) if env else None,
            container=_cut(env.container, 80) if env else None,
            kernel=_cut(env.kernel, 200) if env else None,
            shm_bytes=env.shm_bytes if env else None,
            findings=tuple(SnapshotFinding.of(f) for f in sorted(
                report.findings, key=lambda f: _RANK[f.severity])[:MAX_FINDINGS]),
            truncated=tuple(truncated))

    @classmethod
    def failed(cls, host: str, why: str, *, elapsed_s: float,
               taken_at: float | None = None) -> HostSnapshot:
        """A snapshot that could not be taken, and why."""
        return cls(host=host, taken_at=time.time() if taken_at is None else taken_at,
                   elapsed_s=round(elapsed_s, 3), error=_cut(why))

    # -- what a report says of it --

    def count(self, severity: DoctorSeverity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def gpu_summary(self) -> str:
        """``8 x NVIDIA H200`` (names grouped), ``no NVIDIA driver``, ``no GPU``."""
        if self.error is not None:
            return "not read"
        if self.driver_present is False:
            return "no NVIDIA driver"
        if not self.gpus:
            return "no GPU"
        names: dict[str, int] = {}
        for gpu in self.gpus:
            names[gpu.name or "?"] = names.get(gpu.name or "?", 0) + 1
        return ", ".join(f"{n} x {name}" for name, n in names.items())

    def summary(self) -> str:
        """One line: driver, GPUs, where it runs, findings by severity (or why it failed)."""
        if self.error is not None:
            return f"doctor snapshot failed after {self.elapsed_s:.1f} s: {self.error}"
        parts = [f"driver {self.driver} CUDA {self.cuda or '?'}" if self.driver else None,
                 self.gpu_summary(),
                 " in ".join(w for w in (self.container, self.virtualization) if w) or None,
                 f"{self.count(DoctorSeverity.ERROR)} errors, {self.count(DoctorSeverity.WARNING)} "
                 f"warnings, {self.count(DoctorSeverity.INFO)} info"]
        return "; ".join(p for p in parts if p)


def snapshot_timeout() -> float:
    """:data:`SNAPSHOT_TIMEOUT_S`, or the seconds :data:`SNAPSHOT_TIMEOUT_ENV` gives (a value
    that is not a number above 0 is ignored)."""
    try:
        value = float(os.environ.get(SNAPSHOT_TIMEOUT_ENV, ""))
    except ValueError:
        return SNAPSHOT_TIMEOUT_S
    return value if 0 < value < float("inf") else SNAPSHOT_TIMEOUT_S


async def snapshot_host(executor: Executor, *, timeout: float | None = None) -> HostSnapshot:
    """The host's snapshot within ``timeout`` seconds (default :func:`snapshot_timeout`):
    the doctor's host script in quick mode, each ``nvidia-smi`` command given a third of it,
    its text :func:`redacted`. Never raises except ``CancelledError``: a failure is a snapshot
    with ``error``."""
    return redacted(await _snapshot(executor, timeout))


async def _snapshot(executor: Executor, timeout: float | None) -> HostSnapshot:
    limit = snapshot_timeout() if timeout is None else timeout
    taken_at = time.time()
    started = time.monotonic()
    raw: dict[str, Any] | None = None
    try:
        # The executor ends the script at ``limit``; the outer deadline covers a connection
        # that does not answer (SSH) and the analysis.
        raw, error, _ = await asyncio.wait_for(
            run_script(executor, {"cmd_timeout_s": max(limit / 3, 0.001)}, timeout=limit),
            timeout=limit + 5.0)
        if raw is None:
            return HostSnapshot.failed(executor.name, error or "the doctor's host script failed",
                                       elapsed_s=time.monotonic() - started, taken_at=taken_at)
        # A record of the host beside a run, not a verdict on it: a study or server on
        # CPU (the sim, transformers) expects no driver, and one on GPUs fails on its own.
        report = analyze(raw, host=executor.name, gpus_expected=False)
    except TimeoutError:
        return HostSnapshot.failed(executor.name, f"the doctor probe did not end within "
                                   f"{limit + 5.0:g} s", elapsed_s=time.monotonic() - started,
                                   taken_at=taken_at)
    except Exception as exc:  # a bug or an output analyze cannot read: said, never raised
        return HostSnapshot.failed(executor.name, f"the doctor's report could not be made: "
                                   f"{type(exc).__name__}: {exc}",
                                   elapsed_s=time.monotonic() - started, taken_at=taken_at)
    elapsed = round(time.monotonic() - started, 3)
    return HostSnapshot.of(report.model_copy(update={"elapsed_s": elapsed}), taken_at=taken_at)


def redacted(snapshot: HostSnapshot) -> HostSnapshot:
    """The snapshot with anything that looks secret in its text replaced
    (:func:`cleanslate.redact.redact_data`: a token on a kernel command line, a URL
    password in an evidence line); the store redacts it again on the way in and out."""
    return HostSnapshot.model_validate(redact_data(snapshot.model_dump(mode="json")))


__all__ = ["SNAPSHOT_TIMEOUT_ENV", "SNAPSHOT_TIMEOUT_S", "SNAPSHOT_VERSION", "GpuRow",
           "HostSnapshot", "PairRow", "SnapshotFinding", "redacted", "snapshot_host",
           "snapshot_timeout"]
