"""A slot's check spares the runs of the study's other slots (``Scope.exclude_markers``) as
strays, but not what they hold of this slot: memory on its GPUs, its GPUs' device files, its
port. A local user who copies another slot's marker into a process gains nothing on this slot."""

from __future__ import annotations

from typing import Any

from cleanslate.probe.snapshot import DeviceHolder, GpuProcess, ListeningSocket, ProcessInfo
from cleanslate.verdict.findings import FindingKind, Verdict
from cleanslate.verdict.rules import Scope, evaluate
from tests.verdict._build import gpu as _gpu
from tests.verdict._build import proc as _proc
from tests.verdict._build import reading as _reading
from tests.verdict._build import snapshot as _snapshot

OTHER = "r-20261201-000000-beef"  # the run of the other slot (GPU 0, port 30000)
SCOPE = Scope(gpus=frozenset({1}), exclude_markers=frozenset({OTHER}))


def _other_run(pid: int = 50, **kw: Any) -> ProcessInfo:
    return _proc(pid, comm="sim::scheduler_", cmdline=("sim::scheduler_TP0",), run_marker=OTHER,
                 **kw)


def test_the_other_slots_run_on_its_own_gpu_is_not_a_stray_here() -> None:
    child = _proc(51, ppid=50, environ_readable=False)  # a child with no readable marker
    snap = _snapshot(_reading(_gpu(0, used=30_000, procs=(GpuProcess(pid=50, used_mib=30_000),)),
                              _gpu(1)),
                     (_other_run(), child),
                     device_holders=(DeviceHolder(pid=50, devices=("/dev/nvidia0",
                                                                   "/dev/nvidiactl")),),
                     ports_in_scope=(30001,))
    verdict = evaluate(snap, SCOPE)
    assert verdict.verdict == Verdict.CLEAN, verdict.findings


def test_without_the_exclusion_the_same_process_is_a_stray() -> None:
    snap = _snapshot(_reading(_gpu(0), _gpu(1)), (_other_run(),))
    scope = Scope(gpus=frozenset({1}))
    assert FindingKind.STRAY_PROCESS in [f.kind for f in evaluate(snap, scope).findings]


def test_memory_device_or_port_of_this_slot_is_a_finding_marker_or_not() -> None:
    cases = {
        "memory": dict(gpu=_reading(_gpu(0), _gpu(1, used=9_000, procs=(
            GpuProcess(pid=50, used_mib=9_000),)))),
        "device": dict(gpu=_reading(_gpu(0), _gpu(1)),
                       device_holders=(DeviceHolder(pid=50, devices=("/dev/nvidia1",)),)),
        "port": dict(gpu=_reading(_gpu(0), _gpu(1)), ports_in_scope=(30001,), sockets=(
            ListeningSocket(port=30001, address="127.0.0.1", inode=2, pids=(50,)),)),
    }
    for name, extra in cases.items():
        gpu = extra.pop("gpu")
        verdict = evaluate(_snapshot(gpu, (_other_run(),), **extra), SCOPE)
        assert any(f.pid == 50 for f in verdict.findings), (name, verdict.findings)
        # An open device file without memory is a warning, as for any process.
        assert verdict.verdict == (Verdict.CLEAN if name == "device" else Verdict.DIRTY), name
