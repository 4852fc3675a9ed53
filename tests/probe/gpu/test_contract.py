"""The GPU backend contract (:mod:`cleanslate.testing.gpu_contract`) on every built-in backend:
NVML over a replay of ``pynvml`` fed with real dumps, ``nvidia-smi`` over stand-in scripts that
replay real outputs, the simulated GPU ledger, and ``none``. Each backend is held to it both
answering and failing (no library, a hung driver, a missing tool, no ledger): returns within
its timeout, never raises, a failure is ``ok=False`` with an error, unknown fields are ``None``
and named."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml as real_pynvml
import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu import backend_names, get_backend, resolve_backend
from cleanslate.probe.gpu.base import GpuBackend
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.gpu.nvidia_smi import NvidiaSmiBackend
from cleanslate.probe.gpu.nvml import NvmlBackend
from cleanslate.probe.gpu.sim import SimGpuBackend
from cleanslate.probe.snapshot import Gpu, GpuReading
from cleanslate.sim import ledger
from cleanslate.testing.gpu_contract import check_read

from ._data import nvml_dump
from ._pynvml_replay import ReplayNvml
from .test_nvidia_smi_backend import _install, replaying


@dataclass
class Case:
    """One backend in one situation, and whether its reading must be ok."""

    backend: GpuBackend
    ok: bool
    timeout: float = 5.0
    executor: LocalExecutor | None = None


class _Remote(LocalExecutor):
    name = "user@gpu-host"
    is_local = False


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


HEALTHY = {"ecc": 0, "retired": 0, "remapped": (0, 0, 0, 0), "pci": "00000000:18:00.0"}
#: What the hung NVML replay waits for: set after each test (``nvml_threads_end``).
HANG = threading.Event()
Setup = Callable[[Path, pytest.MonkeyPatch], Case]


def nvml(dump: str, ok: bool, timeout: float = 5.0, remote: bool = False,
         **replay: object) -> Setup:
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
        monkeypatch.setitem(sys.modules, "pynvml", ReplayNvml(nvml_dump(dump), **replay))
        return Case(NvmlBackend(), ok, timeout, _Remote() if remote else None)
    return setup


def smi(gpu: str, apps: str, ok: bool) -> Setup:
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
        replaying(tmp_path, monkeypatch, gpu, apps)
        return Case(NvidiaSmiBackend(), ok)
    return setup


def smi_script(body: str, ok: bool, timeout: float = 5.0) -> Setup:
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
        _install(tmp_path / "bin", body, monkeypatch)
        return Case(NvidiaSmiBackend(), ok, timeout)
    return setup


def smi_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return Case(NvidiaSmiBackend(), ok=False)


def sim_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
    directory = str(tmp_path / "gpus")
    ledger.write_config(directory, gpus=2, memory_total_mib=1000)
    ledger.allocate(directory, 1, 300, "sim::scheduler_TP1")  # held by this (live) process
    return Case(SimGpuBackend(directory), ok=True)


def sim_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path))
    return Case(get_backend("sim"), ok=True)


def sim_no_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
    monkeypatch.delenv("CLEANSLATE_SIM_GPU_DIR", raising=False)
    return Case(SimGpuBackend(), ok=False)


def sim_python(body: str, timeout: float = 5.0) -> Setup:
    """The ledger reader run by an interpreter that misbehaves (hangs, prints garbage)."""
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Case:
        python = _script(tmp_path / "python", body)
        return Case(SimGpuBackend(str(tmp_path)), False, timeout, LocalExecutor(python))
    return setup


CASES: dict[str, Setup] = {
    "nvml-busy": nvml("busy_nvml", ok=True, extra={0: HEALTHY, 1: HEALTHY}),
    "nvml-busy-unread-fields": nvml("busy_nvml", ok=True),
    "nvml-idle-orphans": nvml("orphans_nvml", ok=True),
    "nvml-no-v2-memory": nvml("orphans_nvml", ok=True, no_v2=True),
    "nvml-lost-gpu": nvml("busy_nvml", ok=True, fail={
        (0, "nvmlDeviceGetMemoryInfo"): real_pynvml.NVMLError_GpuIsLost()}),
    "nvml-no-library": nvml("busy_nvml", ok=False,
                            init_error=real_pynvml.NVMLError_LibraryNotFound()),
    "nvml-remote-host": nvml("busy_nvml", ok=False, remote=True),
    "nvml-hung-driver": nvml("busy_nvml", ok=False, timeout=0.3, hang=HANG),
    "nvidia-smi-busy": smi("busy_query", "busy_apps", ok=True),
    "nvidia-smi-idle": smi("idle_query", "idle_apps", ok=True),
    "nvidia-smi-no-device": smi("bad_index", "bad_index", ok=False),
    "nvidia-smi-bad-field": smi("bad_field", "idle_apps", ok=False),
    "nvidia-smi-missing": smi_missing,
    "nvidia-smi-hung": smi_script("exec sleep 30\n", ok=False, timeout=0.5),
    "nvidia-smi-garbage": smi_script("echo 'not, a, csv'\n", ok=False),
    "sim-ledger": sim_ledger,
    "sim-ledger-from-env": sim_from_env,
    "sim-no-ledger": sim_no_ledger,
    "sim-hung-reader": sim_python("exec sleep 30\n", timeout=0.5),
    "sim-garbage-reader": sim_python("echo '[1, 2'\n"),
    "none": lambda tmp_path, monkeypatch: Case(NoGpuBackend(), ok=True),
    "none-auto-fallback": lambda tmp_path, monkeypatch: Case(NoGpuBackend.for_auto(), ok=True),
}


@pytest.fixture
def nvml_threads_end() -> Iterator[None]:
    """Release a hung replay and wait for the NVML worker thread, so no test inherits it."""
    HANG.clear()
    yield
    HANG.set()
    deadline = time.monotonic() + 5
    while any(t.name == "cleanslate-nvml" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "an NVML worker thread is still running"
        time.sleep(0.01)


@pytest.mark.usefixtures("nvml_threads_end")
@pytest.mark.parametrize("case", CASES)
def test_every_backend_keeps_the_contract(case: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    setup = CASES[case](tmp_path, monkeypatch)
    executor = setup.executor or LocalExecutor()
    reading = asyncio.run(check_read(setup.backend, executor, timeout=setup.timeout, ok=setup.ok))
    if case.startswith("sim-ledger"):
        assert reading.gpus and reading.gpus[0].source == "sim"


def test_every_registered_backend_has_a_case() -> None:
    covered = {name.split("-")[0] if not name.startswith("nvidia-smi") else "nvidia-smi"
               for name in CASES}
    assert set(backend_names()) <= covered


def test_a_name_taken_by_another_class_is_refused() -> None:
    from cleanslate.probe.gpu import register

    class Impostor(NoGpuBackend):
        name = "none"

    with pytest.raises(ValueError, match=re.escape(
            "'none' is already registered by cleanslate.probe.gpu.none.NoGpuBackend")):
        register(Impostor)
    assert type(get_backend("none")) is NoGpuBackend


def test_a_run_environment_configures_the_sim_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", "/elsewhere")
    backend = get_backend("sim", env={"CLEANSLATE_SIM_GPU_DIR": str(tmp_path)})
    assert isinstance(backend, SimGpuBackend) and backend.directory == str(tmp_path)
    assert get_backend("sim", env={}).directory is None  # read from our environment then
    assert type(get_backend("nvml", env={"X": "1"})) is NvmlBackend
    assert asyncio.run(resolve_backend(backend, LocalExecutor())) is backend
    assert os.environ["CLEANSLATE_SIM_GPU_DIR"] == "/elsewhere"


class _Breaks(GpuBackend):
    """Not registered: breaks one clause of the contract, named by ``how``."""

    name = "contract-breaks"

    def __init__(self, how: str) -> None:
        self.how = how

    async def read(self, executor: object, timeout: float) -> GpuReading:
        if self.how == "raises":
            raise RuntimeError("driver exploded")
        if self.how == "slow":
            await asyncio.sleep(timeout + 1.7)
        if self.how == "silent":
            return GpuReading(backend=self.name, ok=False)
        gpu = Gpu(index=0, uuid="GPU-x", memory_used_mib=None, memory_total_mib=80,
                  source=self.name)
        return GpuReading(backend=self.name, ok=True, gpus=(gpu,))


@pytest.mark.parametrize(("how", "needle"), [
    ("raises", "read raised RuntimeError: driver exploded"),
    ("slow", "with a timeout of 0.1 s"),
    ("silent", "a failed reading without an error"),
    ("zero", "is None, not named"),
])
def test_the_contract_catches_a_backend_that_breaks_it(how: str, needle: str) -> None:
    with pytest.raises(AssertionError, match=needle):
        asyncio.run(check_read(_Breaks(how), LocalExecutor(), timeout=0.1, ok=True))
