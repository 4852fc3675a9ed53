"""The verdict rules on the real H200 outputs of ``tests/fixtures/nvidia-h200x2/`` and on small
snapshots that isolate one rule each."""

from __future__ import annotations

import pytest

from cleanslate.probe.gpu.nvidia_smi import reading_from_outputs
from cleanslate.probe.gpu.nvml import reading_from_raw
from cleanslate.probe.snapshot import (
    DeviceHolder,
    GpuProcess,
    GpuReading,
    ListeningSocket,
    ProcessInfo,
    SourceStatus,
)
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.findings import FindingKind, HostVerdict, Severity, Verdict
from cleanslate.verdict.rules import Scope, evaluate, excluded_pids
from tests.probe.gpu._data import FIXTURES, nvml_dump, output
from tests.verdict._build import gpu as _gpu
from tests.verdict._build import proc as _proc
from tests.verdict._build import reading as _reading
from tests.verdict._build import snapshot as _snapshot


def _ps_fixture(stem: str) -> tuple[ProcessInfo, ...]:
    """Processes from a ``ps -eo pid,ppid,pgid,sid,stat,etimes,comm,args`` fixture."""
    lines = (FIXTURES / f"{stem}.out").read_text().splitlines()[1:]
    out = []
    for line in lines:
        pid, ppid, pgid, sid, stat, _elapsed, comm, *args = line.split()
        out.append(ProcessInfo(pid=int(pid), ppid=int(ppid), pgid=int(pgid), sid=int(sid),
                               state=stat[0], comm=comm, cmdline=tuple(args), create_time=0.0,
                               environ_readable=True))
    return tuple(out)


def _kinds(verdict: HostVerdict, severity: Severity | None = None) -> list[FindingKind]:
    return [f.kind for f in verdict.findings if severity is None or f.severity == severity]


def _smi(query: str, apps: str) -> GpuReading:
    return reading_from_outputs(output(query), output(apps))


# --- the fixture scenarios ------------------------------------------------------------------


def test_idle_is_clean() -> None:
    verdict = evaluate(_snapshot(_smi("idle_query", "idle_apps")), Scope())
    assert verdict.verdict == Verdict.CLEAN, verdict.findings
    # [N/A] in retired_pages.pending is an unknown value, not a zero and not a failure.
    assert all(g.retired_pages_pending is None for g in verdict.gpus)
    assert all("retired_pages.pending" in " ".join(g.unknown_fields) or
               "retired_pages_pending" in " ".join(g.unknown_fields) for g in verdict.gpus)


def test_busy_names_every_pid_and_gpu() -> None:
    verdict = evaluate(_snapshot(_smi("busy_query", "busy_apps"), _ps_fixture("busy_ps")), Scope())
    assert verdict.verdict == Verdict.DIRTY
    gpu_procs = {(f.pid, f.gpu) for f in verdict.findings if f.kind == FindingKind.GPU_PROCESS}
    assert gpu_procs == {(584, 0), (627, 1), (665, 1)}
    held = {f.gpu: f for f in verdict.findings if f.kind == FindingKind.GPU_MEMORY_HELD}
    assert set(held) == {0, 1}
    assert held[0].evidence["memory_used_mib"] == 41487
    assert held[1].evidence["pids"] == [627, 665]
    # nvidia-smi shows the executable; the renamed comm comes from the process table.
    f627 = next(f for f in verdict.findings if f.kind == FindingKind.GPU_PROCESS and f.pid == 627)
    assert "sim::worker_TP1" in f627.message
    assert f627.evidence["gpu_process_name"] == "/opt/venv/bin/python3"
    # The renamed workers also match the sim engine's signature.
    strays = {f.pid for f in verdict.findings if f.kind == FindingKind.STRAY_PROCESS}
    assert strays == {627, 665}


def test_busy_through_nvml_agrees_with_nvidia_smi() -> None:
    smi = evaluate(_snapshot(_smi("busy_query", "busy_apps")), Scope())
    nvml = evaluate(_snapshot(reading_from_raw(nvml_dump("busy_nvml"))), Scope())
    assert nvml.verdict == smi.verdict == Verdict.DIRTY

    def key(v: HostVerdict) -> set[tuple[int | None, int | None]]:
        return {(f.pid, f.gpu) for f in v.findings if f.kind == FindingKind.GPU_PROCESS}

    assert key(nvml) == key(smi)


def test_orphans_dirty_on_gpu1_only() -> None:
    reading = reading_from_raw(nvml_dump("orphans_nvml"))
    verdict = evaluate(_snapshot(reading), Scope())
    assert verdict.verdict == Verdict.DIRTY
    errors = [f for f in verdict.findings if f.severity == Severity.ERROR]
    assert {f.gpu for f in errors} == {1}
    assert {f.pid for f in errors if f.kind == FindingKind.GPU_PROCESS} == {627, 665}
    # GPU 0: NVML v1 says ~618 MiB used (driver-reserved memory); v2 says 3 MiB. Clean.
    gpu0 = next(g for g in verdict.gpus if g.index == 0)
    assert gpu0.memory_used_mib is not None and gpu0.memory_used_mib < 10
    assert evaluate(_snapshot(reading), Scope(gpus=frozenset({0}))).verdict == Verdict.CLEAN


def test_final_query_is_clean() -> None:
    verdict = evaluate(_snapshot(_smi("final_query", "idle_apps")), Scope())
    assert verdict.verdict == Verdict.CLEAN


@pytest.mark.parametrize(("stem", "message"), [
    ("bad_field", 'Field "memory.bogus" is not a valid field to query.'),
    ("bad_index", "No devices were found"),
])
def test_nvidia_smi_errors_are_unknown_with_its_message(stem: str, message: str) -> None:
    reading = reading_from_outputs(output(stem), output("idle_apps"))
    snapshot = _snapshot(reading, sources=(SourceStatus(name="gpu:nvidia-smi", ok=reading.ok,
                                                        error=reading.error),))
    verdict = evaluate(snapshot, Scope())
    assert verdict.verdict == Verdict.UNKNOWN
    unknown = [f for f in verdict.findings if f.severity == Severity.UNKNOWN]
    assert any(message in f.message for f in unknown)


# --- one rule at a time ---------------------------------------------------------------------


def test_idle_memory_tolerance_and_baseline() -> None:
    assert evaluate(_snapshot(_reading(_gpu(used=60))), Scope()).verdict == Verdict.CLEAN
    dirty = evaluate(_snapshot(_reading(_gpu(used=615))), Scope())
    assert _kinds(dirty) == [FindingKind.GPU_MEMORY_HELD]
    assert "no process visible" in dirty.findings[0].message
    # On a driver without v2 the idle GPU reads ~615 MiB: a baseline makes that the idle level.
    base = Baseline.from_snapshot(_snapshot(_reading(_gpu(used=615))))
    assert evaluate(_snapshot(_reading(_gpu(used=650))), Scope(), base).verdict == Verdict.CLEAN
    assert evaluate(_snapshot(_reading(_gpu(used=700))), Scope(), base).verdict == Verdict.DIRTY


def test_unknown_memory_is_unknown_not_zero() -> None:
    verdict = evaluate(_snapshot(_reading(_gpu(used=None, unknown_fields=("memory.used",)))),
                       Scope())
    assert verdict.verdict == Verdict.UNKNOWN


def test_health_problems_are_errors() -> None:
    verdict = evaluate(_snapshot(_reading(
        _gpu(0, ecc_uncorrected=2), _gpu(1, remapped_rows_pending=True),
        _gpu(2, health=("GPU is lost",)), _gpu(3, retired_pages_pending=True),
    )), Scope())
    assert verdict.verdict == Verdict.DIRTY
    by_gpu = {f.gpu: f.severity for f in verdict.findings if f.kind == FindingKind.GPU_HEALTH}
    assert by_gpu == {0: Severity.ERROR, 1: Severity.ERROR, 2: Severity.ERROR,
                      3: Severity.WARNING}


def test_gpu_set_changed_since_baseline() -> None:
    base = Baseline.from_snapshot(_snapshot(_reading(_gpu(0), _gpu(1))))
    verdict = evaluate(_snapshot(_reading(_gpu(0))), Scope(), base)
    assert _kinds(verdict, Severity.ERROR) == [FindingKind.GPU_COUNT_CHANGED]
    missing = evaluate(_snapshot(_reading(_gpu(0))), Scope(gpus=frozenset({0, 5})))
    assert any(f.gpu == 5 for f in missing.findings if f.kind == FindingKind.GPU_COUNT_CHANGED)


def test_failed_critical_source_is_unknown_and_optional_source_a_warning() -> None:
    sources = (SourceStatus(name="processes", ok=False, error="timed out"),
               SourceStatus(name="kmsg", ok=False, critical=False, error="EPERM"))
    verdict = evaluate(_snapshot(_reading(), sources=sources), Scope())
    assert verdict.verdict == Verdict.UNKNOWN
    assert {f.severity for f in verdict.findings} == {Severity.UNKNOWN, Severity.WARNING}


def test_failed_gpu_reading_never_reads_clean() -> None:
    reading = GpuReading(backend="nvml", ok=False, error="NVML did not answer within 2 s")
    snap = _snapshot(reading, sources=(SourceStatus(name="gpu:nvml", ok=False,
                                                    error=reading.error),))
    assert evaluate(snap, Scope()).verdict == Verdict.UNKNOWN


def test_any_gpu_process_is_an_error_whatever_its_name() -> None:
    verdict = evaluate(_snapshot(_reading(_gpu(used=3000, procs=[GpuProcess(pid=42,
                                                                             used_mib=2990)])),
                                 [_proc(42, comm="my_training", cmdline=("./train",))]), Scope())
    assert {f.kind for f in verdict.findings} == {FindingKind.GPU_PROCESS,
                                                   FindingKind.GPU_MEMORY_HELD}


def test_device_file_holders() -> None:
    procs = [_proc(10, comm="python3"), _proc(11, comm="nvidia-persiste"), _proc(12)]
    holders = (DeviceHolder(pid=10, devices=("/dev/nvidia0", "/dev/nvidiactl")),
               DeviceHolder(pid=11, devices=("/dev/nvidia0",)),
               DeviceHolder(pid=12, devices=("/dev/nvidia1",)))
    reading = _reading(_gpu(0), _gpu(1, used=900, procs=[GpuProcess(pid=12, used_mib=890)]))
    verdict = evaluate(_snapshot(reading, procs, device_holders=holders), Scope())
    sev = {f.pid: f.severity for f in verdict.findings if f.kind == FindingKind.DEVICE_FILE_HOLDER}
    assert sev == {10: Severity.WARNING, 12: Severity.ERROR}  # the persistence daemon is normal
    only_gpu0 = evaluate(_snapshot(reading, procs, device_holders=holders),
                         Scope(gpus=frozenset({0})))
    assert only_gpu0.verdict == Verdict.CLEAN


def test_marker_makes_any_process_a_stray_and_engines_narrow_the_scope() -> None:
    procs = [_proc(20, run_marker="run-7"), _proc(21, comm="VLLM::EngineCor")]
    verdict = evaluate(_snapshot(_reading(), procs), Scope())
    assert {f.pid for f in verdict.findings if f.kind == FindingKind.STRAY_PROCESS} == {20, 21}
    narrowed = evaluate(_snapshot(_reading(), procs), Scope(engines=("sglang",)))
    assert {f.pid for f in narrowed.findings if f.kind == FindingKind.STRAY_PROCESS} == {20}


def test_zombie_leader_with_live_threads_is_an_error() -> None:
    procs = [_proc(30, comm="VLLM::Worker", state="Z", threads=12),
             _proc(31, comm="VLLM::Worker", state="Z", threads=1),
             _proc(32, comm="bash", state="Z", threads=1)]
    verdict = evaluate(_snapshot(_reading(), procs), Scope())
    sev = {f.pid: f.severity for f in verdict.findings if f.kind == FindingKind.ZOMBIE}
    assert sev == {30: Severity.ERROR, 31: Severity.WARNING, 32: Severity.INFO}


def test_d_state_engine_process_is_an_error() -> None:
    verdict = evaluate(_snapshot(_reading(), [_proc(40, comm="sglang::schedul", state="D")]),
                       Scope())
    assert FindingKind.D_STATE in _kinds(verdict, Severity.ERROR)


def test_port_owner_is_named_and_invisible_owner_still_counts() -> None:
    sockets = (ListeningSocket(port=8000, address="0.0.0.0", inode=1, pids=(50,)),
               ListeningSocket(port=30000, address="::", inode=2, pids=()))
    verdict = evaluate(_snapshot(_reading(), [_proc(50, comm="uvicorn")], sockets=sockets),
                       Scope())
    ports = {f.port: f for f in verdict.findings if f.kind == FindingKind.PORT_IN_USE}
    assert ports[8000].pid == 50 and "uvicorn" in ports[8000].message
    assert ports[30000].pid is None and "not visible" in ports[30000].message


def test_self_exclusion_covers_descendants_and_remote_wrappers() -> None:
    procs = [
        _proc(100, comm="sshd"),
        _proc(101, comm="bash", ppid=100, sid=101),
        _proc(102, comm="timeout", ppid=101, sid=101),
        _proc(103, comm="python3", ppid=102, sid=101),  # the collector
        _proc(200, comm="cleanslate", ppid=1),
        _proc(201, comm="nvidia-smi", ppid=200),
        _proc(202, comm="sleep", ppid=201),
    ]
    snap = _snapshot(_reading(), procs, collector_pid=103)
    assert excluded_pids(snap, [200]) == {101, 102, 103, 200, 201, 202}


def test_kernel_threads_of_the_host_are_not_new_but_pid_2_of_a_namespace_is() -> None:
    init = _proc(1, ppid=0)
    before = _snapshot(_reading(), [init], listeners=())
    kthreads = [_proc(2, comm="kthreadd", cmdline=(), ppid=0, pgid=0, sid=0),
                _proc(80, comm="kworker/0:1", cmdline=(), ppid=2, pgid=0, sid=0)]
    in_namespace = [_proc(2, comm="bash", ppid=1), _proc(80, comm="sleep", ppid=2)]
    baseline = Baseline.from_snapshot(before)
    host = evaluate(_snapshot(_reading(), [init, *kthreads], listeners=()), Scope(), baseline)
    assert FindingKind.NEW_PROCESS not in _kinds(host)
    container = evaluate(_snapshot(_reading(), [init, *in_namespace], listeners=()), Scope(),
                         baseline)
    assert sorted(f.pid for f in container.findings
                  if f.kind == FindingKind.NEW_PROCESS) == [2, 80]


def test_a_forged_parent_loop_above_the_collector_ends_the_walks() -> None:
    procs = [_proc(1, ppid=0), _proc(300, ppid=301, sid=300), _proc(301, ppid=300, sid=300),
             _proc(302, ppid=301, sid=300)]  # 302: the collector
    baseline = Baseline.from_snapshot(_snapshot(_reading(), procs[:1], listeners=()))
    snap = _snapshot(_reading(), procs, collector_pid=302, listeners=())
    assert excluded_pids(snap, []) == {300, 301, 302}
    assert FindingKind.NEW_PROCESS not in _kinds(evaluate(snap, Scope(), baseline))
