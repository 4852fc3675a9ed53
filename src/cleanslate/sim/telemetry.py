"""The simulated GPUs' telemetry: what NVML would say about a GPU running the simulated engine.

The launcher writes, every :data:`PERIOD_S`, one file per GPU it uses into the simulated GPU
ledger (:mod:`cleanslate.sim.ledger`), ``telemetry-<gpu>.json``, replaced atomically::

    {"pid": 1234, "start_ticks": 567890, "port": 30000, "gpu": 0, "wall": 1764504000.12,
     "util": 87.5, "sm": 61.2, "mem": 139800, "pw": 512.3, "ej": 1234567, "smc": 1980,
     "memc": 3201, "maxc": 1980, "ev": [], "rx": 12.0, "tx": 3.1, "temp": 63.0, "xid": []}

The keys are the GPU sampler's record (:mod:`cleanslate.bench._gpu_sampler`): utilisation and
SM activity in percent over the last period, memory used (MiB: the ledger's count, read once a
second), power (W), the energy counter (mJ since the server started, as NVML's total energy
counter), SM, memory and largest SM clocks (MHz), active clock-event reasons, PCIe KiB/s in and
out, temperature (C). ``pid`` and ``start_ticks`` name the writer: a reader believes a file
only while that process lives.

The model (``docs/sim-model.md``): utilisation is the share of the period the scheduler spent
in steps; SM activity weights each step by the SMs it keeps busy (prefill 0.9, decode 0.3 to
0.9 with the batch); power is ``75 + 625 x (0.25 util + 0.75 SM activity)`` W times the clock's
share of its largest value; temperature follows power; PCIe carries the token ids (4 bytes per
prompt token in, per generated token out). An idle GPU reports the ``gpu_idle`` reason and a
345 MHz SM clock. The ``throttle-clock`` fault runs the SM clock lower while busy with
``hw_thermal_slowdown`` and a hot GPU (:mod:`cleanslate.sim.faults`).

Standard library only (the launcher imports it; nothing here needs the server's packages).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from cleanslate.sim.engine import Engine
from cleanslate.sim.ledger import proc_start_ticks, read_ledger
from cleanslate.sim.model import MAX_SM_CLOCK_MHZ

#: Seconds between two telemetry files (NVML's utilisation window is 1/6 s to 1 s).
PERIOD_S = 0.1
#: Seconds between two reads of the ledger's memory count.
MEMORY_PERIOD_S = 1.0
IDLE_W = 75.0
MAX_W = 700.0
IDLE_SM_CLOCK_MHZ = 345
MEM_CLOCK_MHZ = 3201
IDLE_TEMPERATURE_C = 32.0
THROTTLED_TEMPERATURE_C = 91.0
#: Bytes a token id takes on the bus.
TOKEN_BYTES = 4


def telemetry_path(directory: str, gpu: int) -> str:
    return os.path.join(directory, f"telemetry-{gpu}.json")


def power_w(util: float, sm_active: float, clock_share: float) -> float:
    """The modelled board power (W) of a GPU whose utilisation and SM activity are shares in
    [0, 1] and whose SM clock is ``clock_share`` of its largest."""
    return IDLE_W + (MAX_W - IDLE_W) * (0.25 * util + 0.75 * sm_active) * clock_share


class TelemetryWriter:
    """Writes the telemetry files of one simulated server's GPUs (see the module docstring).
    ``now``: the clock of the engine's loop (``loop.time``)."""

    def __init__(self, directory: str, gpus: Sequence[int], engine: Engine, *, port: int,
                 throttle_mhz: int | None, now: Callable[[], float]) -> None:
        self.directory = directory
        self.gpus = tuple(gpus)
        self.engine = engine
        self.port = port
        self.throttle_mhz = throttle_mhz
        self.now = now
        self.pid = os.getpid()
        self.start_ticks = proc_start_ticks(self.pid)
        self.energy_j = 0.0
        self._last = now()
        self._busy, self._active = engine.busy_at(self._last)
        self._tokens = (engine.prefill_tokens, engine.decode_tokens)
        self._memory: dict[int, int] = {}
        self._memory_at = float("-inf")

    def _read_memory(self, now: float) -> None:
        if now - self._memory_at < MEMORY_PERIOD_S:
            return
        self._memory_at = now
        result = read_ledger(self.directory)
        for gpu in result.get("gpus", []):
            self._memory[int(gpu["index"])] = int(gpu["memory_used_mib"])

    def tick(self) -> dict[str, Any]:
        """Write every GPU's file for the period since the last tick; returns the record
        (without ``gpu``)."""
        now = self.now()
        dt = max(1e-6, now - self._last)
        busy, active = self.engine.busy_at(now)
        util = min(1.0, max(0.0, (busy - self._busy) / dt))
        sm = min(1.0, max(0.0, (active - self._active) / dt))
        prefill, decode = self.engine.prefill_tokens, self.engine.decode_tokens
        rx = (prefill - self._tokens[0]) * TOKEN_BYTES / 1024 / dt
        tx = (decode - self._tokens[1]) * TOKEN_BYTES / 1024 / dt
        self._last, self._busy, self._active = now, busy, active
        self._tokens = (prefill, decode)
        idle = util < 0.01
        clock = (IDLE_SM_CLOCK_MHZ if idle
                 else self.throttle_mhz or MAX_SM_CLOCK_MHZ)
        events = ["gpu_idle"] if idle else (
            ["hw_thermal_slowdown"] if self.throttle_mhz else [])
        power = power_w(util, sm, 1.0 if idle else clock / MAX_SM_CLOCK_MHZ)
        self.energy_j += power * dt
        temperature = (THROTTLED_TEMPERATURE_C if self.throttle_mhz
                       else IDLE_TEMPERATURE_C + 0.06 * power)
        self._read_memory(now)
        record: dict[str, Any] = {
            "pid": self.pid, "start_ticks": self.start_ticks, "port": self.port,
            "wall": time.time(), "util": round(util * 100, 2), "sm": round(sm * 100, 2),
            "pw": round(power, 2), "ej": int(self.energy_j * 1000), "smc": clock,
            "memc": MEM_CLOCK_MHZ, "maxc": MAX_SM_CLOCK_MHZ, "ev": events,
            "rx": round(rx, 3), "tx": round(tx, 3), "temp": round(temperature, 1), "xid": [],
        }
        for gpu in self.gpus:
            entry = {**record, "gpu": gpu, "mem": self._memory.get(gpu)}
            path = telemetry_path(self.directory, gpu)
            tmp = f"{path}.tmp.{self.pid}"
            with contextlib.suppress(OSError):
                with open(tmp, "w", encoding="utf-8") as fh:
                    json.dump(entry, fh)
                os.replace(tmp, path)
        return record

    async def run(self) -> None:
        """Tick now (a reader finds the files as soon as the server is ready), then every
        :data:`PERIOD_S` until cancelled."""
        self.tick()
        while True:
            await asyncio.sleep(PERIOD_S)
            self.tick()

    def remove(self) -> None:
        """Remove this writer's files (a stopped server's GPUs say nothing more)."""
        for gpu in self.gpus:
            path = telemetry_path(self.directory, gpu)
            try:
                with open(path, encoding="utf-8") as fh:
                    mine = json.load(fh).get("pid") == self.pid
            except (OSError, ValueError, AttributeError):
                continue
            if mine:
                with contextlib.suppress(OSError):
                    os.unlink(path)


__all__ = ["PERIOD_S", "TelemetryWriter", "power_w", "telemetry_path"]
