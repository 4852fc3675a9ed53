"""The host-side GPU sampler: samples a host's GPUs until told to stop, one JSON line a sample.

**Standard library only, Python 3.8 and later**: :mod:`cleanslate.bench._gpu` sends this file's
source to a host's Python (``python3 -I -S - ARGS``, through the run's executor) for the length
of one level, and parses what it printed as untrusted text. Locally the same functions read the
simulated GPUs in a thread.

``ARGS`` is a JSON object: ``source`` (``auto``: NVML, else ``nvidia-smi``; ``nvml``,
``nvidia-smi`` or ``sim``), ``gpus`` (indices), ``interval_s``, ``max_s`` (the most seconds it
samples), ``max_samples``, ``stop_dir`` (a directory it creates, mode 0700, and removes when
done: the caller writes ``stop`` into it to end sampling; an existing one is refused) and
``ledger`` (the simulated GPU ledger, for ``sim``).

It prints, one JSON object a line: ``{"kind": "start", "source", "wall", "gpus": [{"gpu",
"uuid", "name"}]}``; a ``{"kind": "sample", "gpu", "wall", ...}`` per GPU and sample, with the
keys of a record (below) or ``"err"``: why that GPU gave nothing; ``{"kind": "end", "wall",
"samples", "cpu_s", "why"}``; or ``{"kind": "error", "error"}`` when it cannot sample at all.

A record's keys: ``util`` (% of the period a kernel ran), ``sm`` (% SM activity, NVML GPM;
absent elsewhere), ``mem`` (MiB used), ``pw`` (W), ``ej`` (the energy counter, mJ), ``smc``,
``memc``, ``maxc`` (SM, memory and largest SM clock, MHz), ``ev`` (active clock-event reasons
by name), ``rx``, ``tx`` (PCIe KiB/s), ``temp`` (C), ``xid`` (Xid errors since the last
sample). A value the GPU could not give is absent.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time

#: NVML's clock-event (throttle) reason bits, by the name cleanslate reports.
CLOCK_EVENT_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
#: PCIe throughput blocks about 20 ms a counter: read at most this often per GPU.
PCIE_PERIOD_S = 1.0
#: The energy counter costs milliseconds of CPU a read: read at most this often (and last).
ENERGY_PERIOD_S = 1.0
#: The stop file's poll period (seconds).
POLL_S = 0.05
NVML_SUCCESS, NVML_ERROR_TIMEOUT = 0, 10
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PCIE_TX, NVML_PCIE_RX = 0, 1
XID_EVENT = 0x8


def event_names(mask: int) -> list[str]:
    """The names of the bits set in an NVML clock-event reason mask."""
    return [name for bit, name in CLOCK_EVENT_BITS if mask & bit]


def emit(obj: dict) -> None:  # type: ignore[type-arg]
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


# --- NVML through ctypes ------------------------------------------------------------------


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class NvmlError(Exception):
    pass


class CtypesNvml:
    """The NVML calls the sampler needs, through ``libnvidia-ml.so.1``."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as exc:
            raise NvmlError(f"libnvidia-ml.so.1 cannot be loaded: {exc}") from None
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self._fn("nvmlInit_v2")(), "nvmlInit_v2")
        self.handles: dict = {}  # type: ignore[type-arg]
        self.pcie_at: dict = {}  # type: ignore[type-arg]
        self.pcie: dict = {}  # type: ignore[type-arg]
        self.energy_at: dict = {}  # type: ignore[type-arg]
        self.max_clock: dict = {}  # type: ignore[type-arg]
        self.events = None

    def _fn(self, name: str):  # type: ignore[no-untyped-def]
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise NvmlError(f"{name} is not in this driver's NVML")
        return fn

    def _check(self, rc: int, call: str) -> None:
        if rc != NVML_SUCCESS:
            text = self.lib.nvmlErrorString(rc)
            why = text.decode(errors="replace") if text else rc
            raise NvmlError(f"{call}: {why}")

    def handle(self, index: int) -> ctypes.c_void_p:
        if index not in self.handles:
            h = ctypes.c_void_p()
            self._check(self._fn("nvmlDeviceGetHandleByIndex_v2")(index, ctypes.byref(h)),
                        "nvmlDeviceGetHandleByIndex")
            self.handles[index] = h
        return self.handles[index]  # type: ignore[no-any-return]

    def text(self, call: str, index: int) -> str | None:
        buf = ctypes.create_string_buffer(96)
        try:
            rc = self._fn(call)(self.handle(index), buf, 96)
        except NvmlError:
            return None
        return buf.value.decode(errors="replace") if rc == NVML_SUCCESS else None

    def _uint(self, call: str, *args: object) -> int | None:
        value = ctypes.c_uint()
        try:
            rc = self._fn(call)(*args, ctypes.byref(value))
        except NvmlError:
            return None
        return value.value if rc == NVML_SUCCESS else None

    def _ull(self, call: str, *args: object) -> int | None:
        value = ctypes.c_ulonglong()
        try:
            rc = self._fn(call)(*args, ctypes.byref(value))
        except NvmlError:
            return None
        return value.value if rc == NVML_SUCCESS else None

    def register_xid(self, indices: list) -> None:  # type: ignore[type-arg]
        """Ask NVML for Xid events of these GPUs (silently none where it cannot)."""
        try:
            events = ctypes.c_void_p()
            self._check(self._fn("nvmlEventSetCreate")(ctypes.byref(events)),
                        "nvmlEventSetCreate")
            for index in indices:
                self._fn("nvmlDeviceRegisterEvents")(self.handle(index),
                                                     ctypes.c_ulonglong(XID_EVENT), events)
            self.events = events  # type: ignore[assignment]
        except NvmlError:
            self.events = None

    def new_xids(self) -> dict:  # type: ignore[type-arg]
        """Xid errors since the last call, by GPU index."""
        found: dict = {}  # type: ignore[type-arg]
        if self.events is None:
            return found
        by_handle = {h.value: i for i, h in self.handles.items()}
        for _ in range(64):
            data = _EventData()
            rc = self._fn("nvmlEventSetWait_v2")(self.events, ctypes.byref(data), 0)
            if rc != NVML_SUCCESS:
                break
            index = by_handle.get(data.device)
            if index is not None:
                found.setdefault(index, []).append(int(data.eventData))
        return found

    def sample(self, index: int, now: float,
               final: bool = False) -> dict:  # type: ignore[type-arg]
        h = self.handle(index)
        rec: dict = {}  # type: ignore[type-arg]
        util = _Utilization()
        if self._fn("nvmlDeviceGetUtilizationRates")(h, ctypes.byref(util)) == NVML_SUCCESS:
            rec["util"] = util.gpu
        mem = _Memory()
        if self._fn("nvmlDeviceGetMemoryInfo")(h, ctypes.byref(mem)) == NVML_SUCCESS:
            rec["mem"] = mem.used / 1048576
        power = self._uint("nvmlDeviceGetPowerUsage", h)
        if power is not None:
            rec["pw"] = power / 1000
        # 2.5 ms of CPU a call on an H100: at most once a second, and on the last sample
        if final or now - self.energy_at.get(index, float("-inf")) >= ENERGY_PERIOD_S:
            energy = self._ull("nvmlDeviceGetTotalEnergyConsumption", h)
            if energy is not None:
                self.energy_at[index] = now
                rec["ej"] = energy
        for key, call, kind in (("smc", "nvmlDeviceGetClockInfo", NVML_CLOCK_SM),
                                ("memc", "nvmlDeviceGetClockInfo", NVML_CLOCK_MEM)):
            value = self._uint(call, h, kind)
            if value is not None:
                rec[key] = value
        if index not in self.max_clock:  # fixed for a GPU
            self.max_clock[index] = self._uint("nvmlDeviceGetMaxClockInfo", h, NVML_CLOCK_SM)
        if self.max_clock[index] is not None:
            rec["maxc"] = self.max_clock[index]
        mask = self._ull("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:
            mask = self._ull("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if mask is not None:
            rec["ev"] = event_names(mask)
        temp = self._uint("nvmlDeviceGetTemperature", h, 0)
        if temp is not None:
            rec["temp"] = temp
        if now - self.pcie_at.get(index, float("-inf")) >= PCIE_PERIOD_S:
            self.pcie_at[index] = now
            self.pcie[index] = (self._uint("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_RX),
                                self._uint("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_TX))
        rx, tx = self.pcie.get(index, (None, None))
        if rx is not None:
            rec["rx"] = rx
        if tx is not None:
            rec["tx"] = tx
        return rec

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.events is not None:
                self.lib.nvmlEventSetFree(self.events)
            self.lib.nvmlShutdown()


# --- the simulated GPUs -------------------------------------------------------------------


def _alive(pid: object, start_ticks: object) -> bool:
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:  # type: ignore[call-overload]
            data = fh.read().decode(errors="replace")
    except (OSError, ValueError, TypeError):
        return False
    rest = data[data.rfind(")") + 2:].split()
    if not rest or rest[0] in ("Z", "X", "x"):
        return False
    if start_ticks is None:
        return True
    try:
        return bool(int(rest[19]) == int(start_ticks))  # type: ignore[call-overload]
    except (IndexError, ValueError, TypeError):
        return False


def sim_gpu_count(directory: str) -> int:
    """The ledger's GPU count (8 without a config); raises OSError for a missing ledger."""
    if not os.path.isdir(directory):
        raise OSError(f"simulated GPU ledger {directory!r} does not exist")
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except FileNotFoundError:
        return 8
    except ValueError:
        raise OSError("the simulated GPU ledger's config.json is not JSON") from None
    return int(config.get("gpus", 8)) if isinstance(config, dict) else 8


def sim_sample(directory: str, index: int) -> dict:  # type: ignore[type-arg]
    """GPU ``index``'s record from its telemetry file (:mod:`cleanslate.sim.telemetry`), or
    ``{"err": why}``: a ledger that is gone, a GPU outside it, no live server writing it."""
    try:
        count = sim_gpu_count(directory)
    except OSError as exc:
        return {"err": str(exc)}
    if not 0 <= index < count:
        return {"err": f"GPU {index} is not in the simulated GPU ledger ({count} GPUs)"}
    path = os.path.join(directory, f"telemetry-{index}.json")
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.loads(fh.read(65536))
    except FileNotFoundError:
        return {"err": f"no simulated server uses GPU {index} (no telemetry file)"}
    except (OSError, ValueError) as exc:
        return {"err": f"unreadable telemetry of simulated GPU {index}: {exc}"}
    if not isinstance(record, dict):
        return {"err": f"telemetry of simulated GPU {index} is not an object"}
    if not _alive(record.get("pid"), record.get("start_ticks")):
        return {"err": f"the simulated server that used GPU {index} is gone"}
    return record


# --- nvidia-smi ---------------------------------------------------------------------------

SMI_FIELDS = ("index", "uuid", "name", "utilization.gpu", "memory.used", "power.draw",
              "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks_event_reasons.active",
              "temperature.gpu")
SMI_KEYS = ("gpu", "uuid", "name", "util", "mem", "pw", "smc", "memc", "maxc", "ev", "temp")


def smi_record(line: str) -> dict | None:  # type: ignore[type-arg]
    """One ``--format=csv,noheader,nounits`` line as a record (``None``: not such a line)."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(SMI_FIELDS):
        return None
    rec: dict = {}  # type: ignore[type-arg]
    for key, cell in zip(SMI_KEYS, cells):  # noqa: B905 (Python 3.8 on a host)
        if cell in ("", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"):
            continue
        if key in ("uuid", "name"):
            rec[key] = cell[:96]
        elif key == "ev":
            with contextlib.suppress(ValueError):
                rec[key] = event_names(int(cell, 16))
        else:
            with contextlib.suppress(ValueError):
                rec[key] = int(cell) if key == "gpu" else float(cell)
    return rec if isinstance(rec.get("gpu"), int) else None


def run_smi(args: dict, stop: str, deadline: float) -> int:  # type: ignore[type-arg]
    """Sample with ``nvidia-smi --query-gpu ... -lms``; returns the samples printed."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        emit({"kind": "error", "error": "neither NVML nor nvidia-smi is available"})
        return 0
    fields = list(SMI_FIELDS)
    ms = max(50, int(float(args.get("interval_s", 0.25)) * 1000))
    gpus = ",".join(str(int(g)) for g in args.get("gpus", []))
    probe = subprocess.run([exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader",
                            "-i", gpus], capture_output=True, timeout=20, check=False)
    if probe.returncode != 0:  # a driver older than the clocks_event_reasons name
        fields[9] = "clocks_throttle_reasons.active"
    proc = subprocess.Popen(
        [exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits", "-i", gpus,
         "-lms", str(ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    emit({"kind": "start", "source": "nvidia-smi", "wall": time.time(), "gpus": []})
    count = 0
    limit = int(args.get("max_samples", 20000))
    os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
    buffered = b""
    try:
        while time.time() < deadline and not os.path.exists(stop) and count < limit:
            time.sleep(POLL_S)
            chunk = proc.stdout.read() or b""  # type: ignore[union-attr]
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            now = time.time()
            for raw in lines:
                rec = smi_record(raw.decode(errors="replace"))
                if rec is not None:
                    rec.update(kind="sample", wall=now)
                    emit(rec)
                    count += 1
            if proc.poll() is not None:
                emit({"kind": "error", "error": f"nvidia-smi exited with {proc.returncode}"})
                break
    finally:
        with contextlib.suppress(OSError):
            proc.terminate()
            proc.wait(timeout=5)
    return count


# --- the loop -----------------------------------------------------------------------------


def main(argv: list) -> int:  # type: ignore[type-arg]
    try:
        args = json.loads(argv[1])
        gpus = [int(g) for g in args["gpus"]]
        interval = min(60.0, max(0.05, float(args["interval_s"])))
        stop_dir = str(args["stop_dir"])
        deadline = time.time() + float(args.get("max_s", 3600))
        limit = int(args.get("max_samples", 20000))
        source = str(args.get("source", "auto"))
    except (IndexError, KeyError, ValueError, TypeError) as exc:
        emit({"kind": "error", "error": f"bad arguments: {exc}"})
        return 2
    try:
        os.mkdir(stop_dir, 0o700)
    except OSError as exc:
        emit({"kind": "error", "error": f"cannot create the stop directory: {exc}"})
        return 2
    stop = os.path.join(stop_dir, "stop")
    start_cpu = time.process_time()
    count = 0
    why = "stopped"
    try:
        nvml = None
        if source in ("auto", "nvml"):
            try:
                nvml = CtypesNvml()
            except NvmlError as exc:
                if source == "nvml":
                    emit({"kind": "error", "error": str(exc)})
                    return 1
        if source == "nvidia-smi" or (source == "auto" and nvml is None):
            count = run_smi(args, stop, deadline)
        else:
            meta = []
            if nvml is not None:
                for g in gpus:
                    meta.append({"gpu": g, "uuid": nvml.text("nvmlDeviceGetUUID", g),
                                 "name": nvml.text("nvmlDeviceGetName", g)})
                nvml.register_xid(gpus)
            emit({"kind": "start", "source": "nvml" if nvml is not None else "sim",
                  "wall": time.time(), "gpus": meta})
            ledger = str(args.get("ledger") or "")
            while True:
                now = time.time()
                final = os.path.exists(stop)
                xids = nvml.new_xids() if nvml is not None else {}
                for g in gpus:
                    try:
                        rec = (nvml.sample(g, now, final) if nvml is not None
                               else sim_sample(ledger, g))
                    except NvmlError as exc:
                        rec = {"err": str(exc)}
                    rec = dict(rec, kind="sample", gpu=g, wall=now)
                    if xids.get(g):
                        rec["xid"] = xids[g]
                    emit(rec)
                count += 1
                if final:
                    break
                if now >= deadline or count >= limit:
                    why = "max_s" if now >= deadline else "max_samples"
                    break
                next_at = now + interval
                while time.time() < next_at and not os.path.exists(stop):
                    time.sleep(min(POLL_S, max(0.0, next_at - time.time())))
            if nvml is not None:
                nvml.close()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(stop)
        with contextlib.suppress(OSError):
            os.rmdir(stop_dir)
        emit({"kind": "end", "wall": time.time(), "samples": count,
              "cpu_s": time.process_time() - start_cpu, "why": why})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
