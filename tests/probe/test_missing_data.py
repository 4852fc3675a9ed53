"""Missing data is never clean (issue 12): what the probe cannot read is said, and a reading
that is not the collector's is UNKNOWN.

The unreadable-environment tests run the probe as ``nobody`` (``runuser``), so that the
environments of root's processes cannot be read, and start a process as ``nobody`` too; they
skip where this user cannot switch users.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from cleanslate.hosts.base import CommandResult
from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import GpuReading, ProcessInfo, Snapshot
from cleanslate.verdict import check as check_module
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.check import CheckOptions, check_hosts
from cleanslate.verdict.findings import FindingKind, Severity, Verdict
from cleanslate.verdict.rules import Scope, evaluate
from tests.conftest import Processes

SYSTEM_PYTHON = "/usr/bin/python3"


class AsUser(LocalExecutor):
    """Runs every command as another user (``runuser -u USER --``)."""

    def __init__(self, user: str, python: str) -> None:
        super().__init__(python=python)
        self.user = user

    async def run(self, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        return await super().run(["runuser", "-u", self.user, "--", *argv], timeout=timeout,
                                 stdin=stdin, env=env)


@pytest.fixture
def as_nobody() -> Iterator[Path]:
    """A folder ``nobody`` can enter (pytest's own temporary tree is root's alone)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to probe as another user")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} (a Python nobody can run) is not installed")
    folder = Path(tempfile.mkdtemp(prefix="cleanslate-nobody-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: Only our own marker would count as a stray: other software cannot change the verdict.
NOTHING_ELSE = Scope(engines=(), markers=frozenset({f"r-none-{uuid.uuid4().hex}"}))


def _unreadable(snapshot: Snapshot, scope: Scope) -> dict[str, dict[str, object]]:
    verdict = evaluate(snapshot, scope)
    return {str(f.evidence["what"]): {"severity": f.severity, "pids": f.evidence.get("pids"),
                                      "message": f.message, "verdict": verdict.verdict}
            for f in verdict.findings if f.kind == FindingKind.UNREADABLE}


@pytest.mark.parametrize("probe", ["collector", "fallback"])
def test_an_unreadable_environment_is_a_warning_naming_the_count(
    procs: Processes, as_nobody: Path, probe: str
) -> None:
    """The issue's reproduction: a process whose /proc/PID/environ cannot be read was silently
    taken as unmarked. Probing as ``nobody``: root's processes (``runuser`` here) cannot be
    read, ``nobody``'s own (``sleep``) can."""
    runuser = procs.start(["runuser", "-u", "nobody", "--", "sleep", "60"])
    python = SYSTEM_PYTHON
    if probe == "fallback":
        fake = as_nobody / "python3"
        fake.write_text("#!/bin/sh\necho 'sh: 1: python3: not found' >&2\nexit 127\n")
        fake.chmod(0o755)
        python = str(fake)
    shm = as_nobody / "shm"
    shm.mkdir()
    shm.chmod(0o755)
    snapshot = asyncio.run(probe_host(AsUser("nobody", python), NoGpuBackend(), timeout=20,
                                      shm_dir=str(shm)))
    assert all(s.ok for s in snapshot.sources if s.critical), snapshot.sources
    if probe == "fallback":
        assert any(s.name == "run_markers" for s in snapshot.sources)
    by_pid = {p.pid: p for p in snapshot.processes}
    assert by_pid[runuser.pid].environ_readable is False
    sleeper = [p for p in snapshot.processes if p.ppid == runuser.pid]
    assert sleeper and sleeper[0].environ_readable and sleeper[0].uid == 65534

    found = _unreadable(snapshot, NOTHING_ELSE)
    environ = found["the environment"]
    assert environ["severity"] == Severity.WARNING and environ["verdict"] == Verdict.CLEAN
    pids = environ["pids"]
    assert isinstance(pids, list) and runuser.pid in pids and sleeper[0].pid not in pids
    assert f"of {len(pids)} process" in str(environ["message"])
    assert "the open files" in found  # root's /proc/PID/fd cannot be listed by nobody either
    strict = _unreadable(snapshot, Scope(engines=(), markers=NOTHING_ELSE.markers, strict=True))
    assert strict["the environment"]["severity"] == Severity.UNKNOWN
    assert strict["the environment"]["verdict"] in (Verdict.UNKNOWN, Verdict.DIRTY)


def _proc(pid: int, **kw: object) -> ProcessInfo:
    fields: dict[str, object] = {"ppid": 1, "pgid": pid, "sid": pid, "state": "S", "comm": "x",
                                 "create_time": 1.0, "environ_readable": True, **kw}
    return ProcessInfo.model_validate({"pid": pid, **fields})


def _snapshot(*procs: ProcessInfo, **extra: object) -> Snapshot:
    return Snapshot.model_validate({"host": "h", "taken_at": "t", "elapsed_s": 0.1,
                                    "processes": procs,
                                    "gpu": GpuReading(backend="none", ok=True), **extra})


def test_kernel_threads_zombies_and_own_processes_are_not_counted() -> None:
    snapshot = _snapshot(_proc(2, ppid=0, pgid=0, sid=0, environ_readable=False),
                         _proc(3, ppid=2, pgid=0, sid=0, environ_readable=False),
                         _proc(4, state="Z", environ_readable=False),
                         _proc(5, environ_readable=False), _proc(6, environ_readable=False))
    found = _unreadable(snapshot, Scope(exclude_roots=frozenset({5})))
    assert found["the environment"]["pids"] == [6]


def test_hidden_processes_and_unreadable_stat_are_said() -> None:
    snapshot = _snapshot(_proc(10), proc_hidepid="hidepid=2", stat_unreadable=(11,),
                         fd_unreadable=(10,))
    found = _unreadable(snapshot, Scope())
    assert set(found) == {"processes", "the status (/proc/PID/stat)", "the open files"}
    assert "hidepid=2" in str(found["processes"]["message"])
    strict = _unreadable(snapshot, Scope(strict=True))
    assert {f["severity"] for f in strict.values()} == {Severity.UNKNOWN}
    assert evaluate(snapshot, Scope(strict=True)).verdict == Verdict.UNKNOWN


# --- a reading that is not the collector's --------------------------------------------------


def _impostor(folder: Path, output: str) -> LocalExecutor:
    """A ``python`` on the host that prints ``output`` whatever it is given."""
    fake = folder / "python3"
    fake.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{output}'\n")
    fake.chmod(0o755)
    return LocalExecutor(python=str(fake))


@pytest.mark.parametrize(
    "output",
    [
        "{}",
        '{"sources": []}',
        '{"processes": "x", "sources": []}',
        '{"processes": [], "sources": [{"name": "processes", "ok": true}, {"name": '
        '"device_files", "ok": true}, {"name": "ports", "ok": true}]}',
        '{"processes": [{"pid": "one"}], "sources": []}',
        "[1, 2, 3]",
    ],
    ids=["empty", "no-sources", "bad-type", "no-process", "bad-process", "not-an-object"],
)
def test_a_reading_that_is_not_the_collectors_is_unknown(tmp_path: Path, output: str) -> None:
    """Before: ``{}`` from a ``python3`` that is not ours gave a snapshot with no sources to
    fail and no processes: CLEAN. A malformed one raised a validation traceback."""
    snapshot = asyncio.run(probe_host(_impostor(tmp_path, output), NoGpuBackend(), timeout=10))
    failed = [s for s in snapshot.sources if not s.ok and s.critical]
    assert failed, snapshot.sources
    assert evaluate(snapshot, Scope()).verdict == Verdict.UNKNOWN


def test_a_checker_failure_is_unknown_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object, **kwargs: object) -> Snapshot:
        raise RuntimeError("a bug in a probe")

    monkeypatch.setattr(check_module, "probe_host", broken)
    report = asyncio.run(check_hosts([LocalExecutor()], CheckOptions(gpu_backend="none")))
    assert report.verdict == Verdict.UNKNOWN
    assert "a bug in a probe" in report.hosts[0].findings[0].message


def test_a_baseline_from_another_boot_is_said() -> None:
    snapshot = _snapshot(_proc(10), boot_id="now-boot", listeners=())
    base = Baseline.from_snapshot(_snapshot(_proc(10), boot_id="old-boot", listeners=()))
    verdict = evaluate(snapshot, Scope(), base)
    assert any("another boot" in f.message and f.severity == Severity.WARNING
               for f in verdict.findings)
    other_host = base.model_copy(update={"host": "gpu-7", "boot_id": "now-boot"})
    verdict = evaluate(snapshot, Scope(), other_host)
    assert [f.message for f in verdict.findings if "taken on host 'gpu-7'" in f.message]


def test_collector_reports_unreadable_fds_and_stat_fields(tmp_path: Path) -> None:
    """The collector itself (as this user) fills the new fields, and lists every listener
    only when asked."""
    from cleanslate.probe.collect import run_collector

    async def both() -> tuple[dict[str, object] | None, dict[str, object] | None]:
        ex = LocalExecutor()
        plain, _ = await run_collector(ex, ports=[], timeout=10)
        full, _ = await run_collector(ex, ports=[], timeout=10, listeners=True)
        return plain, full

    plain, full = asyncio.run(both())
    assert plain is not None and full is not None
    assert "listeners" not in plain and isinstance(full["listeners"], list)
    for key in ("fd_unreadable", "stat_unreadable", "boot_id"):
        assert key in plain, key
    assert plain["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert sys.executable  # the collector ran under this interpreter


# --- a GPU host that no backend can read ----------------------------------------------------


@pytest.mark.parametrize(
    ("auto_fallback", "devices", "verdict"),
    [
        (True, ("/dev/nvidia0", "/dev/nvidia1"), Verdict.UNKNOWN),  # auto found no backend
        (False, ("/dev/nvidia0",), Verdict.CLEAN),  # the user chose --gpu-backend none
        (True, (), Verdict.CLEAN),  # a CPU-only host
    ],
)
def test_auto_without_a_backend_on_a_gpu_host_is_unknown(
    auto_fallback: bool, devices: tuple[str, ...], verdict: Verdict
) -> None:
    """Before: ``auto`` fell back to ``none`` silently (NVML not initialising, nvidia-smi not on
    PATH) and a GPU host with memory held read CLEAN."""
    snapshot = Snapshot.model_validate({
        "host": "h", "taken_at": "t", "elapsed_s": 0.1, "processes": (_proc(10),),
        "gpu_devices": devices,
        "gpu": GpuReading(backend="none", ok=True, note="n", auto_fallback=auto_fallback)})
    result = evaluate(snapshot, Scope())
    assert result.verdict == verdict, result.findings
    if verdict == Verdict.UNKNOWN:
        assert any("/dev/nvidia0" in f.message for f in result.findings)


def test_auto_resolution_says_it_fell_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from cleanslate.probe.gpu import base
    from cleanslate.probe.gpu.none import NoGpuBackend

    monkeypatch.delenv("CLEANSLATE_SIM_GPU_DIR", raising=False)

    async def never(cls: object, executor: object) -> bool:
        return False

    for name in ("nvml", "nvidia-smi"):
        monkeypatch.setattr(base._REGISTRY[name], "usable", classmethod(never))
    backend = asyncio.run(base.resolve_backend("auto", LocalExecutor()))
    assert isinstance(backend, NoGpuBackend) and backend.auto_fallback
    reading = asyncio.run(backend.read(LocalExecutor(), 1.0))
    assert reading.auto_fallback and reading.ok
    chosen = asyncio.run(base.resolve_backend("none", LocalExecutor()))
    assert isinstance(chosen, NoGpuBackend) and not chosen.auto_fallback
