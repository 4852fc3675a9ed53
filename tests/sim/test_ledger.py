"""The simulated GPU ledger's driver semantics, read through the real `sim` backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cleanslate.hosts.base import CommandResult
from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.base import get_backend, resolve_backend
from cleanslate.probe.gpu.sim import SimGpuBackend, ledger_source
from cleanslate.sim import ledger
from tests.sim.conftest import read_gpus


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_empty_ledger_uses_config_and_defaults(tmp_path: Path) -> None:
    reading = read_gpus(tmp_path)
    assert reading.ok and len(reading.gpus) == 8
    assert all(g.memory_used_mib == 0 and g.memory_total_mib == 143771 for g in reading.gpus)
    ledger.write_config(str(tmp_path), gpus=2, memory_total_mib=81559)
    reading = read_gpus(tmp_path)
    assert [g.memory_total_mib for g in reading.gpus] == [81559, 81559]
    assert all(g.source == "sim" and "Simulated" in (g.name or "") for g in reading.gpus)


def test_missing_ledger_is_a_failed_reading(tmp_path: Path) -> None:
    reading = read_gpus(tmp_path / "nope")
    assert not reading.ok and "does not exist" in (reading.error or "")


def test_memory_counts_while_the_owner_lives(tmp_path: Path) -> None:
    proc = _sleeper()
    try:
        ledger.allocate(str(tmp_path), 3, 1000, "owner", pid=proc.pid)
        gpu = read_gpus(tmp_path).gpus[3]
        assert gpu.memory_used_mib == 1000
        assert [(p.pid, p.used_mib, p.name) for p in gpu.processes] == [(proc.pid, 1000, "owner")]
    finally:
        proc.kill()
    # Not reaped yet: a zombie counts as gone.
    time.sleep(0.2)
    assert Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert read_gpus(tmp_path).gpus[3].memory_used_mib == 0
    proc.wait()
    assert not list(tmp_path.glob("alloc-*"))  # released entries are removed


def test_a_reused_pid_is_not_the_owner(tmp_path: Path) -> None:
    proc = _sleeper()
    try:
        path = ledger.allocate(str(tmp_path), 0, 500, "owner", pid=proc.pid)
        entry = json.loads(Path(path).read_text())
        entry["start_ticks"] -= 1  # as if the original owner had started earlier
        Path(path).write_text(json.dumps(entry))
        assert read_gpus(tmp_path).gpus[0].memory_used_mib == 0
    finally:
        proc.kill()
        proc.wait()


def test_release_delay_after_the_owner_is_gone(tmp_path: Path) -> None:
    proc = _sleeper()
    ledger.allocate(str(tmp_path), 1, 700, "owner", release_delay_s=1.0, pid=proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = read_gpus(tmp_path).gpus[1]
    assert first.memory_used_mib == 700 and first.processes == ()
    time.sleep(1.1)
    assert read_gpus(tmp_path).gpus[1].memory_used_mib == 0


def test_unreadable_entry_is_noted_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "alloc-1-0.json").write_text("{broken")
    reading = read_gpus(tmp_path)
    assert reading.ok and "unreadable ledger entry" in (reading.note or "")


def test_reader_is_stdlib_only_and_runs_isolated(tmp_path: Path) -> None:
    source = ledger_source()
    assert "import cleanslate" not in source and "from cleanslate" not in source
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", source, str(tmp_path)],
        capture_output=True,
        check=True,
        cwd="/",
    )
    assert json.loads(done.stdout)["ok"] is True


class _HangingExecutor(LocalExecutor):
    async def run(self, argv, *, timeout, stdin=None, env=None):  # type: ignore[no-untyped-def]
        return CommandResult(tuple(argv), None, b"", b"", timeout, timed_out=True)


def test_timeout_is_a_failed_reading(tmp_path: Path) -> None:
    reading = asyncio.run(SimGpuBackend(str(tmp_path)).read(_HangingExecutor(), 0.5))
    assert not reading.ok and "timed out" in (reading.error or "")


def test_backend_registry_and_auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(get_backend("sim"), SimGpuBackend)
    monkeypatch.delenv("CLEANSLATE_SIM_GPU_DIR", raising=False)
    assert not asyncio.run(SimGpuBackend.usable(LocalExecutor()))
    reading = asyncio.run(SimGpuBackend().read(LocalExecutor(), 5))
    assert not reading.ok and "CLEANSLATE_SIM_GPU_DIR" in (reading.error or "")
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path))
    assert asyncio.run(resolve_backend("auto", LocalExecutor())).name == "sim"
    assert asyncio.run(get_backend("sim").read(LocalExecutor(), 5)).ok
