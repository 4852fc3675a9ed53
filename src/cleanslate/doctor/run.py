"""Run the doctor on hosts: the host script through the executor, then :func:`analyze`.

The same path locally and over SSH (the script is sent to the host's ``python3`` on stdin, as
the check's collector is), so both give the same report by construction.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any, TypedDict

from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.report import (
    Bandwidth,
    Device,
    DoctorFinding,
    DoctorReport,
    DoctorSeverity,
    HostDoctor,
    Measurement,
)
from cleanslate.hosts import scripts
from cleanslate.hosts.base import Executor

#: Seconds each ``nvidia-smi`` command on the host may take.
DEFAULT_TIMEOUT_S = 20.0
#: Seconds ``--bandwidth`` may take on one host.
BANDWIDTH_TIMEOUT_S = 300.0
#: A measured copy below this fraction of what its link allows is a finding.
LOW_FRACTION = 0.5
#: GB/s per lane and direction of a PCIe generation (after encoding).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


#: The host script (:mod:`cleanslate.doctor._doctor_script`) and ``--bandwidth``'s measurement.
DOCTOR_SCRIPT = "doctor._doctor_script"
BANDWIDTH_SCRIPT = "doctor._bandwidth"


class ScriptOptions(TypedDict, total=False):
    """What the host script is asked: seconds per command, whether to read NVML, and the
    folder systemd-logind's and ``login.defs``' files are read under (``/``; a fixture tree in
    tests)."""

    cmd_timeout_s: float
    nvml: bool
    config_root: str


def nvlink_gbs_per_link(name: str | None) -> float:
    """GB/s per NVLink and direction: 50 on Blackwell (NVLink 5), 25 before (NVLink 2-4)."""
    return 50.0 if name and re.search(r"\b(B\d{2,3}|GB\d{3})\b", name) else 25.0


def link_allows(pair_link: str | None, device: Device | None) -> float | None:
    """GB/s one direction of ``pair_link`` (``NV18``) allows, or None when unknown."""
    if pair_link and (m := re.fullmatch(r"NV(\d+)", pair_link)):
        return int(m.group(1)) * nvlink_gbs_per_link(device.name if device else None)
    return None


def pcie_allows(device: Device) -> float | None:
    """GB/s one direction of the device's PCIe link allows at its *maximum* gen and width."""
    if device.pcie_gen_max in PCIE_LANE_GBS and device.pcie_width_max:
        return PCIE_LANE_GBS[device.pcie_gen_max] * device.pcie_width_max
    return None


async def run_script(executor: Executor, options: ScriptOptions, *, timeout: float
                     ) -> tuple[dict[str, Any] | None, str | None, float]:
    """Run the host script; (its JSON, why not, seconds). With the host's site packages: NVML
    is read through ``pynvml`` where it is installed."""
    started = time.monotonic()
    done = await scripts.run_script(executor, DOCTOR_SCRIPT, options, timeout, output=dict,
                                    what="the doctor's host script", site_packages=True)
    elapsed = round(time.monotonic() - started, 4)
    if done.output is None:
        return None, done.describe_failure(), elapsed
    return done.output, None, elapsed


async def measure(executor: Executor, report: HostDoctor, gpus: list[int] | None,
                  *, timeout: float = BANDWIDTH_TIMEOUT_S) -> Bandwidth:
    """``--bandwidth`` on one host: the figures with what the link allows, or why skipped."""
    if report.driver is None or not report.driver.present or not report.devices:
        return Bandwidth(skipped=f"no NVIDIA GPU on {report.host}")
    started = time.monotonic()
    options = {"gpus": [d.index for d in report.devices] if gpus is None else gpus}
    result = await executor.run([executor.python, "-", json.dumps(options)], timeout=timeout,
                                stdin=scripts.script_source(BANDWIDTH_SCRIPT))
    elapsed = round(time.monotonic() - started, 3)
    if not result.ok:
        return Bandwidth(skipped=f"the measurement failed on {report.host}: "
                         + result.describe_failure(), elapsed_s=elapsed)
    try:
        data = json.loads(result.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Bandwidth(skipped="the measurement printed no JSON", elapsed_s=elapsed)
    if data.get("skipped"):
        return Bandwidth(skipped=f"{data['skipped']} on {report.host}", elapsed_s=elapsed)
    devices = {d.index: d for d in report.devices}
    links = {(p.a, p.b): p.link for p in report.pairs}
    out: list[Measurement] = []
    for m in data.get("measurements") or []:
        pair = tuple(m.get("gpus") or ())
        expected: float | None = None
        note: str | None = None
        what = str(m.get("what"))
        if what.startswith("GPU-to-GPU copy") and len(pair) == 2:
            link = links.get((min(pair), max(pair)))
            expected = link_allows(link, devices.get(pair[0]))
            note = f"link {link}" if link else None
        elif what == "NCCL all-reduce bus bandwidth" and len(pair) > 1:
            expected, note = _group_allows(pair, links, devices)
        elif what.startswith(("host-to-device", "device-to-host")) and pair \
                and pair[0] in devices:
            expected = pcie_allows(devices[pair[0]])
            note = "PCIe at its maximum gen and width"
        out.append(Measurement(what=what, gpus=pair, value=round(float(m["value"]), 2),
                               unit=str(m.get("unit")), expected=expected, note=note))
    notes = (f"NCCL all-reduce not measured: {data['allreduce_skipped']}",) \
        if data.get("allreduce_skipped") else ()
    return Bandwidth(measurements=tuple(out), elapsed_s=elapsed, notes=notes)


def _group_allows(gpus: tuple[int, ...], links: dict[tuple[int, int], str | None],
                  devices: dict[int, Device]) -> tuple[float | None, str | None]:
    """What the slowest link of a group allows an all-reduce's bus bandwidth (its one-way
    bandwidth): NVLink where the pair has it, else PCIe at the lower maximum of the two."""
    worst: tuple[float, str] | None = None
    for i in gpus:
        for j in gpus:
            if j <= i:
                continue
            link = links.get((i, j))
            allows = link_allows(link, devices.get(i))
            if allows is None and i in devices and j in devices:
                pcie = [pcie_allows(devices[g]) for g in (i, j)]
                allows = min((p for p in pcie if p is not None), default=None)
            if allows is None:
                return None, None
            if worst is None or allows < worst[0]:
                worst = (allows, f"slowest link {i}-{j}: {link or 'PCIe'}")
    return (worst[0], worst[1]) if worst else (None, None)


def bandwidth_findings(bandwidth: Bandwidth) -> list[DoctorFinding]:
    """A measured copy below :data:`LOW_FRACTION` of what its link allows."""
    out = []
    for m in bandwidth.measurements:
        if m.expected and m.unit == "GB/s" and m.value < LOW_FRACTION * m.expected:
            out.append(DoctorFinding(
                code="bandwidth_low", severity=DoctorSeverity.WARNING, gpus=m.gpus,
                message=f"{m.what} on GPU {'-'.join(map(str, m.gpus))}: {m.value:g} GB/s, "
                f"{m.value / m.expected:.0%} of the {m.expected:g} GB/s the link allows"
                + (f" ({m.note})" if m.note else ""),
                consequence="traffic over this path (weights loading, KV transfer, "
                "all-reduce) runs at this rate, not the link's",
                evidence=(f"measured: {m.what} {m.value:g} {m.unit}",)))
    return out


async def doctor_host(executor: Executor, *, gpus: list[int] | None = None,
                      bandwidth: bool = False, timeout: float = DEFAULT_TIMEOUT_S,
                      gpus_expected: bool = True) -> HostDoctor:
    """One host's report; a host that cannot be probed is a report with ``error`` (exit 3);
    without an NVIDIA driver, an error finding (exit 1) unless not ``gpus_expected``.
    Never raises for a host-side failure."""
    started = time.monotonic()
    raw, error, _ = await run_script(executor, {"cmd_timeout_s": timeout},
                                     timeout=timeout * 2 + 10)
    if raw is None:
        return HostDoctor(host=executor.name, elapsed_s=round(time.monotonic() - started, 3),
                          error=error)
    report = analyze(raw, host=executor.name, gpus=gpus, gpus_expected=gpus_expected)
    if bandwidth:
        measured = await measure(executor, report, gpus)
        report = report.model_copy(update={
            "bandwidth": measured,
            "findings": (*report.findings, *bandwidth_findings(measured))})
    return report.model_copy(update={"elapsed_s": round(time.monotonic() - started, 3)})


async def doctor_hosts(executors: Sequence[Executor], *, gpus: list[int] | None = None,
                       bandwidth: bool = False, timeout: float = DEFAULT_TIMEOUT_S,
                       gpus_expected: bool = True) -> DoctorReport:
    """Every host's report, in parallel; executors are closed afterwards."""
    try:
        reports = await asyncio.gather(*(doctor_host(e, gpus=gpus, bandwidth=bandwidth,
                                                     timeout=timeout,
                                                     gpus_expected=gpus_expected)
                                         for e in executors))
    finally:
        for e in executors:
            await e.close()
    return DoctorReport(hosts=tuple(reports))


__all__ = ["DEFAULT_TIMEOUT_S", "bandwidth_findings", "doctor_host", "doctor_hosts",
           "link_allows", "measure", "pcie_allows"]
