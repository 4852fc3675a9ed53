"""The settle window opens only on a clean reading (issue 23, Build 5).

Readings whose only error is GPU memory still being released used to open the window, so a
release that outlasted the window made the first clean reading final at once: a stray that
its parent restarts just after the memory is freed read CLEAN. Here the release is the sim
engine's ``slow-release`` (a ledger allocation whose owner has exited, freed ``RELEASE_S``
after it left), read through the real ``sim`` GPU backend, and the stray a real process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.sim import SimGpuBackend
from cleanslate.sim import ledger
from cleanslate.verdict.check import DEFAULT_SETTLE_S, CheckOptions, check_until_clean
from cleanslate.verdict.findings import FindingKind, Verdict
from cleanslate.verdict.rules import Scope
from tests.conftest import Processes

#: Seconds the simulated driver takes to free the exited worker's memory: longer than the
#: settle window, as for a large model's memory after a kill.
RELEASE_S = 0.7

#: Seconds after the memory is freed at which the parent starts the stray again.
RESTART_AFTER_S = 0.25

#: An innocent parent: starts a marked worker, reports its PID and its exit, then, once the
#: release has had time to finish, starts a marked stray again (it lives 3 s).
PARENT = (
    "import os, subprocess, sys, time\n"
    "delay = float(sys.argv[1])\n"
    "env = {**os.environ, 'CLEANSLATE_RUN': os.environ.pop('CHILD_MARKER')}\n"
    "code = 'import sys, time; time.sleep(float(sys.argv[1]))'\n"
    "worker = subprocess.Popen([sys.executable, '-c', code, '0.1'], env=env)\n"
    "print(worker.pid, flush=True)\n"
    "worker.wait()\n"
    "print('gone', flush=True)\n"
    "time.sleep(delay)\n"
    "subprocess.run([sys.executable, '-c', code, '3'], env=env)\n"
)


def test_a_stray_restarted_after_a_slow_release_is_not_clean(
    procs: Processes, tmp_path: Path,
) -> None:
    """The issue's reproduction: the release outlasts the window; the stray comes back
    0.25 s after the memory is freed, inside the window that the first clean reading opens."""
    directory = str(tmp_path / "gpus")
    ledger.write_config(directory, gpus=1)
    marker = f"r-release-{uuid.uuid4().hex[:8]}"
    parent = procs.start([sys.executable, "-c", PARENT, str(RELEASE_S + RESTART_AFTER_S)],
                         env={**os.environ, "CHILD_MARKER": marker}, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    ledger.allocate(directory, 0, 900, "sim::scheduler_TP0", release_delay_s=RELEASE_S,
                    pid=worker)
    assert parent.stdout.readline().strip() == b"gone"
    ledger.release(directory, 0, pid=worker)  # what a sim worker does when it exits
    options = CheckOptions(
        scope=Scope(engines=(), markers=frozenset({marker}),
                    exclude_roots=frozenset({os.getpid()})),
        gpu_backend=SimGpuBackend(directory))
    started = time.monotonic()
    report = asyncio.run(check_until_clean([LocalExecutor()], options, deadline_s=5.0,
                                           interval_s=0.25))
    uc = report.until_clean
    assert uc is not None
    assert report.verdict == Verdict.DIRTY, uc
    kinds = {f.kind for f in report.hosts[0].findings}
    assert FindingKind.RESPAWNED in kinds and FindingKind.STRAY_PROCESS in kinds
    # Seen before the window could close, not at the deadline.
    assert time.monotonic() - started < RELEASE_S + RESTART_AFTER_S + DEFAULT_SETTLE_S + 1.0


def test_the_release_alone_is_waited_for_then_the_full_window(tmp_path: Path) -> None:
    """The control, and the cost: without a stray the host reads CLEAN once the memory is
    freed and then clean readings have held for the whole window."""
    directory = str(tmp_path / "gpus")
    ledger.write_config(directory, gpus=1)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, check=True)
    pid = int(gone.stdout)
    ledger.allocate(directory, 0, 900, "sim::scheduler_TP0", release_delay_s=0.2, pid=pid)
    ledger.release(directory, 0, pid=pid)
    options = CheckOptions(
        scope=Scope(engines=(), markers=frozenset({f"nobody-{uuid.uuid4().hex}"}),
                    exclude_roots=frozenset({os.getpid()})),
        gpu_backend=SimGpuBackend(directory))
    report = asyncio.run(check_until_clean([LocalExecutor()], options, deadline_s=5.0,
                                           interval_s=0.25))
    uc = report.until_clean
    assert report.verdict == Verdict.CLEAN and uc is not None
    assert uc.window_after_s == uc.clean_after_s  # the window opened on a clean reading
    assert uc.clean_after_s is not None and uc.clean_after_s >= 0.15
    assert uc.clean_for_s >= DEFAULT_SETTLE_S
