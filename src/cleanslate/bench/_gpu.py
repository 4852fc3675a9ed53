"""GPU telemetry during a level: a :class:`~cleanslate.bench.LevelObserver` (key ``gpu``) whose
summary is one :class:`~cleanslate.bench.GpuTelemetry` per GPU in the run's scope
(``docs/bench.md``, "GPU telemetry").

Sources, all giving the same record (:mod:`cleanslate.bench._gpu_sampler` lists its keys):

- ``nvml``, this machine: nvidia-ml-py (``pynvml``) in a sampler thread of its own, with SM
  activity from NVML GPM where the GPU has it (Hopper and later);
- any host through its executor (an SSH host, or ``nvidia-smi`` here): the stdlib-only
  sampler script, started when the level starts and stopped (a file in a 0700 directory it
  made) when it ends; its output is parsed as untrusted text, line by line;
- ``sim``: the simulated GPUs' telemetry files (:mod:`cleanslate.sim.telemetry`), read in a
  sampler thread here or by the script on a host.

Nothing here blocks the event loop: NVML and file reads run in the sampler thread (a daemon:
a hung driver leaves it behind and the GPU ``unreadable``), the script in the executor. A GPU
that cannot be read ends as a summary with ``unreadable`` and the reason, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from cleanslate.bench._gpu_sampler import (
    CLOCK_EVENT_BITS,
    ENERGY_PERIOD_S,
    PCIE_PERIOD_S,
    event_names,
    sim_gpu_count,
    sim_sample,
)
from cleanslate.bench._observe import (
    LevelContext,
    LevelEnd,
    LevelObserver,
    Observed,
    ObserveOptions,
    ObserverFactory,
    register_option_observer,
)
from cleanslate.bench._observed import GaugeStats, GpuTelemetry
from cleanslate.hosts.base import Executor
from cleanslate.hosts.scripts import script_argv, script_source
from cleanslate.sim.ledger import ledger_dir

GPU_SOURCES = ("auto", "nvml", "nvidia-smi", "sim", "off")
#: The sampler script (:mod:`cleanslate.bench._gpu_sampler`).
SAMPLER_SCRIPT = "bench._gpu_sampler"
#: How long ``start`` waits for the first (baseline) sample, and ``stop`` for the last one.
FIRST_SAMPLE_S = 2.0
STOP_S = 10.0
#: The longest a host sampler runs (a level longer than this keeps what it sampled).
HOST_MAX_S = 6 * 3600.0
#: What is read of a host sampler's output: bytes in all, bytes a line, lines in all.
MAX_OUTPUT_BYTES = 64 << 20
MAX_LINE_BYTES = 16 << 10
MAX_SAMPLES = 200_000
#: Bounds a value must lie in to be believed (else the value is left out, and counted).
BOUNDS: dict[str, tuple[float, float]] = {
    "util": (0, 100), "sm": (0, 100), "mem": (0, 1 << 24), "pw": (0, 10_000),
    "ej": (0, 1e18), "smc": (0, 20_000), "memc": (0, 50_000), "maxc": (0, 20_000),
    "rx": (0, 1e9), "tx": (0, 1e9), "temp": (-60, 250),
}
KNOWN_EVENTS = frozenset(name for _, name in CLOCK_EVENT_BITS)
MAX_XIDS = 64


def printable(text: object, limit: int = 200) -> str:
    """``text`` as one printable line of at most ``limit`` characters (text from a host or a
    driver is shown, never interpreted)."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[: limit - 3] + "..."


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU at ``t`` (``perf_counter`` seconds of this process); ``err``:
    why there is no reading; ``skipped``: values left out as not believable."""

    t: float
    values: Mapping[str, float] = field(default_factory=dict)
    events: tuple[str, ...] | None = None
    xids: tuple[int, ...] = ()
    err: str | None = None
    skipped: int = 0

    def raw(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": round(self.t, 4), **self.values}
        if self.events is not None:
            out["ev"] = list(self.events)
        if self.xids:
            out["xid"] = list(self.xids)
        if self.err is not None:
            out["err"] = self.err
        return out


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_record(record: object, t: float) -> GpuSample:
    """A sampler record (untrusted: from a host, a file or a driver) as a :class:`GpuSample`;
    a value of the wrong type or outside :data:`BOUNDS` is left out and counted."""
    if not isinstance(record, Mapping):
        return GpuSample(t=t, err="a sample that is not an object")
    err = record.get("err")
    if err is not None:
        return GpuSample(t=t, err=printable(err))
    values: dict[str, float] = {}
    skipped = 0
    for key, (low, high) in BOUNDS.items():
        if key not in record or record[key] is None:
            continue
        number = _number(record[key])
        if number is None or not low <= number <= high:
            skipped += 1
            continue
        values[key] = number
    events: tuple[str, ...] | None = None
    raw_events = record.get("ev")
    if isinstance(raw_events, list):
        known = [e for e in raw_events if isinstance(e, str) and e in KNOWN_EVENTS]
        skipped += len(raw_events) - len(known)
        events = tuple(dict.fromkeys(known))
    elif raw_events is not None:
        skipped += 1
    xids: list[int] = []
    raw_xids = record.get("xid")
    if isinstance(raw_xids, list):
        for x in raw_xids[:MAX_XIDS]:
            if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 20:
                xids.append(x)
            else:
                skipped += 1
    return GpuSample(t=t, values=values, events=events, xids=tuple(xids), skipped=skipped)


# --- the summary ----------------------------------------------------------------------------


def _gauge(samples: Sequence[GpuSample], key: str) -> GaugeStats | None:
    values = [s.values[key] for s in samples if key in s.values]
    if not values:
        return None
    return GaugeStats(mean=sum(values) / len(values), max=max(values))


def _energy_j(good: Sequence[GpuSample]) -> tuple[float | None, str | None]:
    """Joules from the first good sample to the last: the energy counter's increase, or the
    power integrated (trapezoids) where the counter is missing or went down."""
    counters = [s for s in good if "ej" in s.values]
    if len(counters) >= 2 and counters[0] is good[0]:
        rise = counters[-1].values["ej"] - counters[0].values["ej"]
        if rise >= 0:
            # the counter is read at most once a second: a tail after its last reading (a
            # GPU lost before the final sample) is power integrated
            tail = _integrated([s for s in good if s.t >= counters[-1].t])
            return rise / 1000.0 + (tail or 0.0), None
    joules = _integrated(good)
    if joules is None:
        return None, None
    return joules, "energy is power integrated over the samples (no energy counter)"


def _integrated(samples: Sequence[GpuSample]) -> float | None:
    """Joules of the power gauge over the samples (trapezoids); ``None`` under two."""
    powered = [s for s in samples if "pw" in s.values]
    if len(powered) < 2:
        return None
    return sum((b.t - a.t) * (a.values["pw"] + b.values["pw"]) / 2
               for a, b in itertools.pairwise(powered))


def summarize(index: int, samples: Sequence[GpuSample], end: LevelEnd, *, source: str,
              uuid: str | None = None, name: str | None = None, failure: str | None = None,
              cpu_ms: float | None = None) -> GpuTelemetry:
    """One GPU's telemetry over a level from its samples (see :class:`GpuTelemetry`):
    gauges over the samples inside ``end.window`` (all of them when none is), energy over all
    of them. ``failure``: why the sampler as a whole gave nothing more (a hung driver, a host
    sampler that printed garbage)."""
    good = [s for s in samples if s.err is None]
    bad = [s for s in samples if s.err is not None]
    base = GpuTelemetry(index=index, uuid=uuid, name=name, source=source,
                        samples=len(samples), sampler_cpu_ms=cpu_ms)
    if not good:
        why = failure or (bad[-1].err if bad else "no sample was taken")
        return base.model_copy(update={"unreadable": printable(f"GPU {index}: {why}")})
    window = [s for s in good if end.window is not None
              and end.window[0] <= s.t <= end.window[1]]
    gauge_window: Literal["steady", "level"] = "steady"
    if not window:
        window, gauge_window = good, "level"
    energy, energy_note = _energy_j(good)
    with_events = [s for s in window if s.events is not None]
    shares: dict[str, float] = {}
    for s in with_events:
        for e in s.events or ():
            shares[e] = shares.get(e, 0.0) + 1
    notes: list[str] = []
    if energy_note:
        notes.append(energy_note)
    unreadable = None
    if samples[-1].err is not None:
        unreadable = printable(f"GPU {index} stopped answering during the level after "
                               f"{len(good)} samples: {samples[-1].err}")
    elif failure is not None:
        unreadable = printable(f"GPU {index}: {failure}")
    elif bad:
        notes.append(printable(f"{len(bad)} of {len(samples)} samples failed: {bad[-1].err}"))
    skipped = sum(s.skipped for s in samples)
    if skipped:
        notes.append(f"{skipped} values not believable (wrong type or out of range) left out")
    maxc = [s.values["maxc"] for s in good if "maxc" in s.values]
    return GpuTelemetry(
        index=index, uuid=uuid, name=name, source=source, samples=len(samples),
        sampler_cpu_ms=cpu_ms, window_samples=len(window), gauge_window=gauge_window,
        utilization_pct=_gauge(window, "util"), sm_active_pct=_gauge(window, "sm"),
        memory_used_mib=_gauge(window, "mem"), power_w=_gauge(window, "pw"),
        energy_j=energy,
        joules_per_output_token=(energy / end.output_tokens
                                 if energy is not None and end.output_tokens > 0 else None),
        sm_clock_mhz=_gauge(window, "smc"), memory_clock_mhz=_gauge(window, "memc"),
        max_sm_clock_mhz=max(maxc) if maxc else None,
        clock_events={k: v / len(with_events) for k, v in sorted(shares.items())},
        pcie_rx_mib_s=_scaled(_gauge(window, "rx")), pcie_tx_mib_s=_scaled(_gauge(window, "tx")),
        temperature_c=_gauge(window, "temp"),
        xid_events=tuple(x for s in samples for x in s.xids)[:MAX_XIDS],
        unreadable=unreadable, note="; ".join(notes) or None)


def _scaled(g: GaugeStats | None) -> GaugeStats | None:
    """KiB/s to MiB/s."""
    return None if g is None else GaugeStats(mean=g.mean / 1024, max=g.max / 1024)


# --- samplers -------------------------------------------------------------------------------


@dataclass
class SamplerResult:
    """What a sampler gathered: samples per GPU, names, and why it stopped early."""

    samples: dict[int, list[GpuSample]]
    meta: dict[int, tuple[str | None, str | None]] = field(default_factory=dict)
    failure: str | None = None
    cpu_ms: float | None = None  # sampler CPU time per sample (all GPUs of it)


class Sampler(Protocol):
    source: str

    async def start(self) -> None: ...

    async def stop(self) -> SamplerResult: ...


class Reader(Protocol):
    """Reads GPUs in the sampler thread: ``open`` once, ``read`` per sample, ``close``."""

    def open(self) -> dict[int, tuple[str | None, str | None]]: ...

    def read(self, now: float, final: bool = False) -> dict[int, Mapping[str, Any]]:
        """One record per GPU; ``final``: the last sample of the measurement."""

    def close(self) -> None: ...


class ThreadSampler:
    """Samples with a :class:`Reader` every ``interval_s`` in a daemon thread of its own."""

    def __init__(self, reader: Reader, gpus: Sequence[int], interval_s: float,
                 source: str) -> None:
        self.reader = reader
        self.gpus = tuple(gpus)
        self.interval_s = interval_s
        self.source = source
        self._stop = threading.Event()
        self._first = threading.Event()
        self._taken: list[tuple[float, dict[int, Mapping[str, Any]]]] = []
        self._meta: dict[int, tuple[str | None, str | None]] = {}
        self._failure: str | None = None
        self._cpu_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="cleanslate-gpu-sampler",
                                        daemon=True)

    def _loop(self) -> None:
        try:
            self._meta = self.reader.open()
        except Exception as exc:
            self._failure = printable(f"{type(exc).__name__}: {exc}")
            self._first.set()
            return
        try:
            while True:
                stopping = self._stop.is_set()
                t = time.perf_counter()
                cpu = time.thread_time()
                try:
                    records = self.reader.read(t, stopping)
                except Exception as exc:
                    records = {g: {"err": f"{type(exc).__name__}: {exc}"} for g in self.gpus}
                self._cpu_s += time.thread_time() - cpu
                self._taken.append((t, records))
                self._first.set()
                if stopping or len(self._taken) >= MAX_SAMPLES:
                    return
                self._stop.wait(max(0.0, t + self.interval_s - time.perf_counter()))
        finally:
            with contextlib.suppress(Exception):
                self.reader.close()

    async def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + FIRST_SAMPLE_S
        while not self._first.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def stop(self) -> SamplerResult:
        self._stop.set()
        deadline = time.monotonic() + max(STOP_S, 2 * self.interval_s)
        while self._thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        failure = self._failure
        if self._thread.is_alive():
            failure = f"the {self.source} reader did not answer within {STOP_S:g} s"
        taken = list(self._taken)
        samples: dict[int, list[GpuSample]] = {g: [] for g in self.gpus}
        for t, records in taken:
            for g in self.gpus:
                record = records.get(g, {"err": "not read"})
                samples[g].append(parse_record(record, t))
        return SamplerResult(samples, dict(self._meta), failure,
                             1000 * self._cpu_s / len(taken) if taken else None)


class PynvmlReader:
    """This machine's GPUs through nvidia-ml-py, SM activity from NVML GPM where supported."""

    def __init__(self, gpus: Sequence[int]) -> None:
        self.gpus = tuple(gpus)
        self.nvml: Any = None
        self.handles: dict[int, Any] = {}
        self.gpm: dict[int, list[Any]] = {}  # [last GPM sample, the other, taken one yet]
        self.pcie_at: dict[int, float] = {}
        self.pcie: dict[int, tuple[float | None, float | None]] = {}
        self.events: Any = None
        self.missing: dict[int, str] = {}
        #: whether the PCIe byte counters answer (None: not tried yet)
        self.pcie_counters: bool | None = None
        self.pcie_count: dict[int, tuple[float, float, float]] = {}
        self.energy_at: dict[int, float] = {}
        self.max_clock: dict[int, int | None] = {}

    def open(self) -> dict[int, tuple[str | None, str | None]]:
        import pynvml

        self.nvml = nvml = pynvml
        nvml.nvmlInit()
        meta: dict[int, tuple[str | None, str | None]] = {}
        for g in self.gpus:
            try:
                h = self.handles[g] = nvml.nvmlDeviceGetHandleByIndex(g)
            except Exception as exc:  # the GPU is not there: each sample says so
                meta[g] = (None, None)
                self.missing[g] = printable(f"{type(exc).__name__}: {exc}")
                continue
            meta[g] = (_text(self._call(nvml.nvmlDeviceGetUUID, h)),
                       _text(self._call(nvml.nvmlDeviceGetName, h)))
            with contextlib.suppress(Exception):
                if nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                    self.gpm[g] = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc(), False]
        with contextlib.suppress(Exception):
            self.events = nvml.nvmlEventSetCreate()
            for h in self.handles.values():
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError,
                                              self.events)
        return meta

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            return None

    def _xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        if self.events is None:
            return found
        by_handle = {id(h): g for g, h in self.handles.items()}
        for _ in range(MAX_XIDS):
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except Exception:
                break
            index = by_handle.get(id(data.device))
            if index is None:
                # handles are fresh objects per event: match by the device's index instead
                index = self._call(self.nvml.nvmlDeviceGetIndex, data.device)
            if isinstance(index, int):
                found.setdefault(index, []).append(int(data.eventData))
        return found

    def _sm_active(self, g: int, h: Any) -> float | None:
        """SM activity (%) between the last GPM sample and one taken now (``None`` for the
        first, or where GPM fails)."""
        slots = self.gpm.get(g)
        if slots is None:
            return None
        nvml = self.nvml
        previous, current, have_previous = slots
        try:
            nvml.nvmlGpmSampleGet(h, current)
        except Exception:
            return None
        value = None
        if have_previous:
            try:
                req = nvml.c_nvmlGpmMetricsGet_t()
                req.version = nvml.NVML_GPM_METRICS_GET_VERSION
                req.numMetrics = 1
                req.sample1 = previous
                req.sample2 = current
                req.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
                nvml.nvmlGpmMetricsGet(req)
                if req.metrics[0].nvmlReturn == 0:
                    value = float(req.metrics[0].value)
            except Exception:
                value = None
        self.gpm[g] = [current, previous, True]
        return value

    def _pcie(self, g: int, h: Any, now: float) -> tuple[float | None, float | None]:
        """PCIe KiB/s in and out: from the byte counters (field values) between two samples
        where the GPU has them, else NVML's throughput (a 20 ms window the driver waits
        for), read at most once per :data:`PCIE_PERIOD_S`."""
        nvml = self.nvml
        if self.pcie_counters is not False:
            values = self._call(nvml.nvmlDeviceGetFieldValues, h,
                                [nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
                                 nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
            if values is not None and all(v.nvmlReturn == 0 for v in values):
                self.pcie_counters = True
                counts = (float(values[0].value.ullVal), float(values[1].value.ullVal))
                previous = self.pcie_count.get(g)
                self.pcie_count[g] = (now, *counts)
                if previous is None or now <= previous[0]:
                    return None, None
                dt = now - previous[0]
                rates = [(c - p) / 1024 / dt for c, p in zip(counts, previous[1:], strict=True)]
                return (rates[0] if rates[0] >= 0 else None,
                        rates[1] if rates[1] >= 0 else None)
            if self.pcie_counters is None:
                self.pcie_counters = False
        if now - self.pcie_at.get(g, float("-inf")) >= PCIE_PERIOD_S:
            self.pcie_at[g] = now
            self.pcie[g] = (
                self._call(nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_RX_BYTES),
                self._call(nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_TX_BYTES))
        return self.pcie.get(g, (None, None))

    def read(self, now: float, final: bool = False) -> dict[int, Mapping[str, Any]]:
        nvml = self.nvml
        xids = self._xids()
        out: dict[int, Mapping[str, Any]] = {}
        for g in self.gpus:
            h = self.handles.get(g)
            if h is None:
                out[g] = {"err": self.missing.get(g, "no handle")}
                continue
            rec: dict[str, Any] = {}
            util = self._call(nvml.nvmlDeviceGetUtilizationRates, h)
            if util is None:
                # the first call to fail tells whether the GPU is gone (GpuIsLost) or fine
                try:
                    nvml.nvmlDeviceGetUtilizationRates(h)
                except Exception as exc:
                    if "NotSupported" not in type(exc).__name__:
                        out[g] = {"err": f"{type(exc).__name__}: {exc}"}
                        continue
            else:
                rec["util"] = util.gpu
            mem = self._call(nvml.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                rec["mem"] = mem.used / 1048576
            power = self._call(nvml.nvmlDeviceGetPowerUsage, h)
            if power is not None:
                rec["pw"] = power / 1000
            # The energy counter costs 2.5 ms of CPU a call on an H100 (against microseconds
            # for the other gauges): read at most once a second, and on the last sample.
            if final or now - self.energy_at.get(g, float("-inf")) >= ENERGY_PERIOD_S:
                energy = self._call(nvml.nvmlDeviceGetTotalEnergyConsumption, h)
                if energy is not None:
                    self.energy_at[g] = now
                    rec["ej"] = energy
            for key, fn, kind in (("smc", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
                                  ("memc", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM)):
                value = self._call(fn, h, kind)
                if value is not None:
                    rec[key] = value
            if g not in self.max_clock:  # fixed for a GPU; 1 ms of CPU a call
                self.max_clock[g] = self._call(nvml.nvmlDeviceGetMaxClockInfo, h,
                                               nvml.NVML_CLOCK_SM)
            if self.max_clock[g] is not None:
                rec["maxc"] = self.max_clock[g]
            mask = self._call(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons",
                                      nvml.nvmlDeviceGetCurrentClocksThrottleReasons), h)
            if mask is not None:
                rec["ev"] = event_names(int(mask))
            temp = self._call(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            if temp is not None:
                rec["temp"] = temp
            rx, tx = self._pcie(g, h, now)
            if rx is not None:
                rec["rx"] = rx
            if tx is not None:
                rec["tx"] = tx
            sm = self._sm_active(g, h)
            if sm is not None:
                rec["sm"] = sm
            if xids.get(g):
                rec["xid"] = xids[g]
            out[g] = rec
        return out

    def close(self) -> None:
        nvml = self.nvml
        if nvml is None:
            return
        for slots in self.gpm.values():
            for sample in slots[:2]:
                with contextlib.suppress(Exception):
                    nvml.nvmlGpmSampleFree(sample)
        with contextlib.suppress(Exception):
            if self.events is not None:
                nvml.nvmlEventSetFree(self.events)
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return printable(value, 96) if isinstance(value, str) and value else None


class SimReader:
    """The simulated GPUs' telemetry files of a ledger on this machine."""

    def __init__(self, directory: str, gpus: Sequence[int]) -> None:
        self.directory = directory
        self.gpus = tuple(gpus)

    def open(self) -> dict[int, tuple[str | None, str | None]]:
        sim_gpu_count(self.directory)  # a missing ledger fails here, with its reason
        return {g: (f"GPU-sim-{g:08d}", "Simulated NVIDIA H200 (cleanslate sim)")
                for g in self.gpus}

    def read(self, now: float, final: bool = False) -> dict[int, Mapping[str, Any]]:
        return {g: sim_sample(self.directory, g) for g in self.gpus}

    def close(self) -> None:
        return None


class FailedSampler:
    """A source that cannot be used at all: every GPU ends with ``why``."""

    def __init__(self, why: str, source: str) -> None:
        self.why = why
        self.source = source

    async def start(self) -> None:
        return None

    async def stop(self) -> SamplerResult:
        return SamplerResult({}, failure=self.why)


class HostSampler:
    """The sampler script on the executor's host, for the length of one level."""

    def __init__(self, executor: Executor, gpus: Sequence[int], interval_s: float,
                 source: str, ledger: str | None = None) -> None:
        self.executor = executor
        self.gpus = tuple(gpus)
        self.interval_s = interval_s
        self.source = source if source != "auto" else "auto"
        self.stop_dir = f"/tmp/cleanslate-gpu-{secrets.token_hex(12)}"
        self.payload = {"source": source, "gpus": list(self.gpus), "interval_s": interval_s,
                        "max_s": HOST_MAX_S, "max_samples": MAX_SAMPLES,
                        "stop_dir": self.stop_dir, "ledger": ledger}
        self._task: asyncio.Task[Any] | None = None
        self._offset = 0.0  # this machine's wall clock minus its perf_counter
        self._started = self._stopped = 0.0

    async def start(self) -> None:
        self._offset = time.time() - time.perf_counter()
        self._started = time.perf_counter()
        self._task = asyncio.create_task(self.executor.run(
            script_argv(self.executor, self.payload), timeout=HOST_MAX_S + 30,
            stdin=script_source(SAMPLER_SCRIPT)))

    async def stop(self) -> SamplerResult:
        task = self._task
        self._stopped = time.perf_counter()
        if task is None:
            return SamplerResult({}, failure="the host sampler was not started")
        failure: str | None = None
        if not task.done():
            try:
                await self.executor.write_file(f"{self.stop_dir}/stop", b"", mode=0o600)
            except OSError as exc:
                failure = printable(f"cannot stop the host sampler: {exc}")
                task.cancel()
        try:
            result = await asyncio.wait_for(asyncio.shield(task),
                                            timeout=STOP_S + 2 * self.interval_s)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
            return SamplerResult({}, failure=failure or "the host sampler did not stop")
        parsed = parse_sampler_output(result.stdout, self.gpus, offset=self._offset,
                                      span=(self._started, self._stopped))
        if parsed.failure is None and not any(parsed.samples.values()):
            why = (result.describe_failure() if not result.ok
                   else "the host sampler printed no samples")
            parsed.failure = printable(why)
        return parsed


def parse_sampler_output(stdout: bytes, gpus: Sequence[int], *, offset: float,
                         span: tuple[float, float]) -> SamplerResult:
    """The sampler script's output (untrusted: any bytes) as samples per GPU. A sample's host
    wall time becomes this process's ``perf_counter`` by ``offset``; when the host's clock is
    off by more than 5 s from ``span`` (this process's start and stop), its samples are moved
    to begin at the span's start."""
    wanted = set(gpus)
    samples: dict[int, list[GpuSample]] = {g: [] for g in gpus}
    meta: dict[int, tuple[str | None, str | None]] = {}
    failure: str | None = None
    cpu_ms: float | None = None
    bad_lines = 0
    first_bad: str | None = None
    rows: list[tuple[int, float, Mapping[str, Any]]] = []
    for raw in stdout[:MAX_OUTPUT_BYTES].split(b"\n"):
        if not raw.strip():
            continue
        obj: object = None
        if len(raw) <= MAX_LINE_BYTES:
            with contextlib.suppress(ValueError, RecursionError):
                obj = json.loads(raw.decode("utf-8", errors="replace"))
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            bad_lines += 1
            first_bad = first_bad or printable(raw[:80].decode(errors="replace"), 80)
            continue
        kind = obj["kind"]
        if kind == "error":
            failure = printable(f"the host sampler failed: {obj.get('error')}")
        elif kind == "start":
            for g in obj.get("gpus") or []:
                if isinstance(g, dict) and g.get("gpu") in wanted:
                    meta[int(g["gpu"])] = (_text(g.get("uuid")), _text(g.get("name")))
        elif kind == "end":
            cpu, count = _number(obj.get("cpu_s")), _number(obj.get("samples"))
            if cpu is not None and count and cpu >= 0 and count > 0:
                cpu_ms = 1000 * cpu / count
        elif kind == "sample":
            g, wall = obj.get("gpu"), _number(obj.get("wall"))
            if not isinstance(g, int) or isinstance(g, bool) or g not in wanted or wall is None:
                bad_lines += 1
                continue
            if g in meta or obj.get("uuid") or obj.get("name"):
                meta.setdefault(g, (_text(obj.get("uuid")), _text(obj.get("name"))))
            if sum(len(v) for v in samples.values()) + len(rows) < MAX_SAMPLES:
                rows.append((g, wall - offset, obj))
    if rows:
        first = min(t for _, t, _ in rows)
        last = max(t for _, t, _ in rows)
        shift = 0.0
        if first < span[0] - 5 or last > span[1] + 5:
            shift = span[0] - first
        for g, t, obj in rows:
            samples[g].append(parse_record(obj, t + shift))
        for g in samples:
            samples[g].sort(key=lambda s: s.t)
    if failure is None and bad_lines and not rows:
        failure = printable(f"the host sampler printed {bad_lines} lines cleanslate cannot "
                            f"read (first: {first_bad!r})")
    return SamplerResult(samples, meta, failure, cpu_ms)


# --- the observer ---------------------------------------------------------------------------


class GpuObserver:
    """Samples the GPUs of a run during one measurement (see the module docstring)."""

    key = "gpu"

    def __init__(self, sampler: Sampler, gpus: Sequence[int]) -> None:
        self.sampler = sampler
        self.gpus = tuple(gpus)

    async def start(self) -> None:
        try:
            await self.sampler.start()
        except Exception as exc:  # never the level's failure
            self.sampler = FailedSampler(printable(f"cannot start: {exc}"), self.sampler.source)

    def latest(self) -> dict[str, float | str]:
        """The newest reading for the live view (``bench._live.live_readings``):
        ``gpu_util_pct`` (the mean over the GPUs that gave one) and ``power_w`` (their sum).
        Empty before the first reading and for a host sampler, whose readings come back when
        the level ends."""
        taken = self.sampler._taken if isinstance(self.sampler, ThreadSampler) else []
        if not taken:
            return {}
        t, records = taken[-1]
        samples = [parse_record(records.get(g, {"err": "not read"}), t) for g in self.gpus]
        utils = [s.values["util"] for s in samples if "util" in s.values]
        powers = [s.values["pw"] for s in samples if "pw" in s.values]
        out: dict[str, float | str] = {}
        if utils:
            out["gpu_util_pct"] = sum(utils) / len(utils)
        if powers:
            out["power_w"] = sum(powers)
        if not out and samples and samples[0].err is not None:
            out["unreadable"] = samples[0].err
        return out

    async def stop(self, end: LevelEnd) -> Observed:
        try:
            result = await self.sampler.stop()
        except Exception as exc:
            result = SamplerResult({}, failure=printable(f"{type(exc).__name__}: {exc}"))
        summaries = []
        raw: list[dict[str, Any]] = []
        for g in self.gpus:
            samples = result.samples.get(g, [])
            uuid, name = result.meta.get(g, (None, None))
            summaries.append(summarize(g, samples, end, source=self.sampler.source,
                                       uuid=uuid, name=name, failure=result.failure,
                                       cpu_ms=result.cpu_ms))
            raw.extend({"gpu": g, **s.raw()} for s in samples)
        return Observed(self.key, tuple(summaries), tuple(raw))


def _pynvml_importable() -> bool:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return False
    return True


def make_sampler(executor: Executor | None, gpus: Sequence[int], source: str,
                 interval_s: float, ledger: str | None = None) -> Sampler:
    """The sampler of ``source`` for the executor's host (``None``: this machine). ``auto``:
    the simulated GPUs where a ledger is named, else NVML here, else the host script (NVML
    through ctypes, else ``nvidia-smi``)."""
    local = executor is None or executor.is_local
    ledger = ledger or ledger_dir()
    if source == "auto":
        if ledger is not None:
            source = "sim"
        elif local:
            source = "nvml" if _pynvml_importable() else "auto"
    if source == "sim":
        if ledger is None:
            return FailedSampler("no simulated GPU ledger is named (CLEANSLATE_SIM_GPU_DIR)",
                                 "sim")
        if local:
            return ThreadSampler(SimReader(ledger, gpus), gpus, interval_s, "sim")
    elif source == "nvml" and local:
        if not _pynvml_importable():
            return FailedSampler("nvidia-ml-py (pynvml) is not importable", "nvml")
        return ThreadSampler(PynvmlReader(gpus), gpus, interval_s, "nvml")
    if executor is None:
        from cleanslate.hosts.local import LocalExecutor

        executor = LocalExecutor()
    return HostSampler(executor, gpus, interval_s, source, ledger)


def gpu_observer(executor: Executor | None = None, gpus: Sequence[int] | None = None,
                 source: str = "auto", *, ledger: str | None = None) -> ObserverFactory | None:
    """The GPU-telemetry observer of each measurement of a run whose GPUs are ``gpus`` on the
    executor's host (``None``: this machine), sampling every ``observe.interval_s`` of the
    measurement's config. ``None`` when there is nothing to watch (no GPUs, ``off``)."""
    if not gpus or source in ("off", "none"):
        return None
    chosen = tuple(gpus)

    def make(ctx: LevelContext) -> LevelObserver:
        options = ctx.config.observe or ObserveOptions()
        return GpuObserver(make_sampler(executor, chosen, source, options.interval_s, ledger),
                           chosen)

    return make


def _from_options(options: ObserveOptions) -> ObserverFactory | None:
    """The observer of the GPUs ``options.gpus`` names on this machine (``bench --gpus``); a
    run on another host brings its own (``tune``'s trial harness)."""
    if not options.gpus:
        return None
    return gpu_observer(None, options.gpus, options.gpu_source)


register_option_observer(_from_options)


def local_gpus(url: str, source: str = "auto", ledger: str | None = None,
               timeout: float = 5.0) -> tuple[int, ...]:
    """The GPUs ``bench`` watches by default: none unless ``url`` is on this machine; then the
    simulated GPUs whose live server listens on the URL's port (a ledger named), else every
    GPU NVML sees here (none where it cannot say within ``timeout`` seconds)."""
    if source == "off":
        return ()
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return ()
    if host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        return ()
    ledger = ledger or ledger_dir()
    if source in ("auto", "sim") and ledger is not None:
        found = []
        try:
            count = sim_gpu_count(ledger)
        except (OSError, ValueError, TypeError):
            return ()
        for g in range(count):
            record = sim_sample(ledger, g)
            if "err" not in record and (port is None or record.get("port") == port):
                found.append(g)
        return tuple(found)
    if source not in ("auto", "nvml") or not _pynvml_importable():
        return ()
    box: list[int] = []

    def read_count() -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
            try:
                box.append(int(pynvml.nvmlDeviceGetCount()))
            finally:
                pynvml.nvmlShutdown()
        except Exception:
            return

    thread = threading.Thread(target=read_count, name="cleanslate-gpu-count", daemon=True)
    thread.start()
    thread.join(timeout)
    return tuple(range(box[0])) if box else ()


__all__ = ["GPU_SOURCES", "GpuObserver", "GpuSample", "gpu_observer", "local_gpus", "make_sampler",
           "parse_record", "parse_sampler_output", "summarize"]
