"""A process's environment is read whole (issue 23): a ``CLEANSLATE_RUN`` marker placed after
4 MiB of other variables was not seen by the collector (it read ``/proc/PID/environ`` up to
4 MiB) and the process was not counted as unreadable either, so a stray could hide its marker.

The child really has that environment: ``execve`` takes up to 6 MiB of arguments and
environment on Linux 4.13+ when the stack limit allows it (a quarter of ``RLIMIT_STACK``), so
the child raises its stack limit before it executes.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.collect import collector_source
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.verdict.findings import FindingKind
from cleanslate.verdict.rules import Scope, evaluate
from tests.conftest import Processes

#: 38 variables of 120 KiB (each under the kernel's 128 KiB per string): 4.45 MiB.
FILL = {f"CS_FILL_{i:02d}": "x" * (120 << 10) for i in range(38)}


def _big_stack() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    want = 64 << 20
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_STACK, (want, hard))


def _start_marked(procs: Processes, run_id: str) -> subprocess.Popen[bytes]:
    """``sleep`` with 4.45 MiB of environment, then ``CLEANSLATE_RUN=run_id`` last."""
    env = {"PATH": "/usr/bin:/bin", **FILL, "CLEANSLATE_RUN": run_id}
    try:
        child = procs.start(["sleep", "60"], env=env, preexec_fn=_big_stack)
    except OSError as exc:  # E2BIG: the hard stack limit is too low for this environment
        pytest.skip(f"cannot start a process with a 4.45 MiB environment: {exc}")
    environ = Path(f"/proc/{child.pid}/environ").read_bytes()
    assert len(environ) > 4 << 20
    assert environ.rstrip(b"\0").endswith(b"CLEANSLATE_RUN=" + run_id.encode())
    return child


@pytest.mark.parametrize("probe", ["collector", "fallback"])
def test_a_marker_after_4_mib_of_environment_is_seen(
    procs: Processes, tmp_path: Path, probe: str
) -> None:
    """Before: the collector read 4 MiB, did not find the marker, and said the environment
    was read (no warning). The fallback probe (``grep`` over the whole file) saw it already."""
    run_id = f"r-big-env-{uuid.uuid4().hex[:8]}"
    child = _start_marked(procs, run_id)
    python = sys.executable
    if probe == "fallback":
        fake = tmp_path / "python3"
        fake.write_text("#!/bin/sh\necho 'sh: 1: python3: not found' >&2\nexit 127\n")
        fake.chmod(0o755)
        python = str(fake)
    snapshot = asyncio.run(probe_host(LocalExecutor(python=python), NoGpuBackend(),
                                      timeout=20, shm_dir=str(tmp_path)))
    assert all(s.ok for s in snapshot.sources if s.critical), snapshot.sources
    if probe == "fallback":
        assert any(s.name == "run_markers" for s in snapshot.sources)
    (proc,) = [p for p in snapshot.processes if p.pid == child.pid]
    assert proc.environ_readable and proc.run_marker == run_id
    verdict = evaluate(snapshot, Scope(engines=(), markers=frozenset({run_id})))
    assert any(f.kind == FindingKind.STRAY_PROCESS and f.pid == child.pid
               for f in verdict.findings), verdict.findings


def _collect(limit: int) -> dict[str, object]:
    """The collector run as the checker runs it (``python3 -I -S -``), with ``environ_limit``."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-", json.dumps({"environ_limit": limit, "kmsg": False})],
        input=collector_source(), capture_output=True, timeout=20, check=True)
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


def test_an_environment_past_the_bound_is_counted_unreadable(procs: Processes) -> None:
    """An environment longer than the collector reads (64 MiB; 1 MiB here) is not searched in
    part: the process counts as unreadable, which the verdict says (a warning, UNKNOWN with
    --strict). A marker before the bound is still found."""
    late = _start_marked(procs, f"r-late-{uuid.uuid4().hex[:8]}")
    early_id = f"r-early-{uuid.uuid4().hex[:8]}"
    early = procs.start(["sleep", "60"], env={"CLEANSLATE_RUN": early_id, **FILL},
                        preexec_fn=_big_stack)
    data = _collect(1 << 20)
    by_pid = {p["pid"]: p for p in data["processes"]}  # type: ignore[attr-defined]
    assert by_pid[late.pid]["environ_readable"] is False
    assert by_pid[late.pid]["run_marker"] is None
    assert by_pid[early.pid]["environ_readable"] is True
    assert by_pid[early.pid]["run_marker"] == early_id
    whole = {p["pid"]: p for p in _collect(8 << 20)["processes"]}  # type: ignore[attr-defined]
    assert whole[late.pid]["environ_readable"] is True
    assert str(whole[late.pid]["run_marker"]).startswith("r-late-")
