"""A replay stand-in for the third-party ``pynvml`` module, fed with a real NVML dump.

It answers the calls the NVML backend makes from a ``*_nvml.out`` fixture, with the real
library's constants and exception classes, so the backend's read path (thread, timeout, error
handling, conversion) runs end to end without a GPU. Values the dump did not record raise
``NVMLError_NotSupported``, as NVML does for what a GPU cannot report. Only ``pynvml`` is
replaced; no cleanslate code is.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pynvml as real


@dataclass(frozen=True)
class Handle:
    index: int


class ReplayNvml(types.ModuleType):
    """``pynvml`` answering from ``dump``.

    ``fail`` maps ``(gpu index, function name)`` to the exception that call raises;
    ``extra`` maps a GPU index to values the dump lacks (``ecc``, ``retired``, ``remapped``,
    ``pci``, ``names``); ``hang`` makes ``nvmlDeviceGetCount`` block until the event is set;
    ``no_v2`` makes the v2 memory call fail as on a driver without it.
    """

    def __init__(
        self,
        dump: Mapping[str, Any],
        *,
        fail: Mapping[tuple[int, str], BaseException] | None = None,
        extra: Mapping[int, Mapping[str, Any]] | None = None,
        hang: threading.Event | None = None,
        no_v2: bool = False,
        init_error: BaseException | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.dump = dump
        self.fail = dict(fail or {})
        self.extra = {k: dict(v) for k, v in (extra or {}).items()}
        self.hang = hang
        self.no_v2 = no_v2
        self.init_error = init_error
        self.initialised = 0
        self.calls: list[str] = []
        for name in dir(real):
            if name.startswith(("NVML_", "NVMLError")) or name == "nvmlMemory_v2":
                setattr(self, name, getattr(real, name))

    def _gpu(self, handle: Handle, call: str) -> Mapping[str, Any]:
        self.calls.append(call)
        error = self.fail.get((handle.index, call))
        if error is not None:
            raise error
        gpu: Mapping[str, Any] = self.dump["gpus"][handle.index]
        return gpu

    def _extra(self, handle: Handle, key: str) -> Any:
        try:
            return self.extra[handle.index][key]
        except KeyError:
            raise real.NVMLError_NotSupported() from None

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.dump["driver"])

    def nvmlDeviceGetCount(self) -> int:
        if self.hang is not None:
            self.hang.wait()
        return len(self.dump["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        handle = Handle(index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return str(self._gpu(handle, "nvmlDeviceGetUUID")["uuid"])

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:
        # Older nvidia-ml-py versions return bytes: the backend must accept both.
        return str(self._gpu(handle, "nvmlDeviceGetName")["name"]).encode()

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> types.SimpleNamespace:
        self._gpu(handle, "nvmlDeviceGetPciInfo")
        return types.SimpleNamespace(busId=self._extra(handle, "pci"))

    def nvmlDeviceGetMemoryInfo(
        self, handle: Handle, version: int | None = None
    ) -> types.SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if not version:
            return types.SimpleNamespace(**gpu["mem_v1"])
        assert version == real.nvmlMemory_v2, version
        if self.no_v2:
            raise real.NVMLError_FunctionNotFound()
        return types.SimpleNamespace(version=version, **gpu["mem_v2"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[types.SimpleNamespace]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [types.SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"]) for p in gpu["procs"]]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for index in range(len(self.dump["gpus"])):
            names = self.extra.get(index, {}).get("names", {})
            if pid in names:
                return str(names[pid])
        raise real.NVMLError_NotFound()

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter: int) -> int:
        self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        assert error_type == real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == real.NVML_VOLATILE_ECC
        return int(self._extra(handle, "ecc"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        return int(self._extra(handle, "retired"))

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        self._gpu(handle, "nvmlDeviceGetRemappedRows")
        corrected, uncorrected, pending, failure = self._extra(handle, "remapped")
        return corrected, uncorrected, pending, failure
