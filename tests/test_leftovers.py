"""The guard between tests (:mod:`tests._leftovers`) sees an orphaned process and a forgotten
child, ends them, and leaves a service's own children alone. Run in the session's private PID
namespace only: outside it the guard is off, and its selection would see the host's
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import _leftovers
from tests.conftest import Processes, isolated

pytestmark = pytest.mark.skipif(not isolated(), reason="the guard runs only in the session's "
                                "private PID namespace (root and unshare)")

ORPHAN = ("import os, time\n"
          "pid = os.fork()\n"
          "if pid == 0:\n"
          "    null = os.open(os.devnull, os.O_WRONLY)\n"
          "    os.dup2(null, 1); os.dup2(null, 2); os.setsid(); time.sleep(60)\n"
          "else:\n"
          "    print(pid, flush=True)\n")


def _alive(pid: int) -> bool:
    proc = _leftovers._read(pid)
    return proc is not None and proc.state not in ("Z", "X")


def test_an_orphan_and_a_forgotten_child_are_found_and_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_leftovers, "GRACE_S", 0.3)
    before = _leftovers.processes()
    forked = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, timeout=30)
    orphan = int(forked.stdout)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    said = _leftovers.settle(before, os.getpid())
    assert time.monotonic() - t0 >= 0.3  # it waited for them to end on their own first
    assert len(said) == 2, said
    assert any(f"PID {orphan} (parent 1)" in line for line in said), said
    assert any(f"PID {child.pid} " in line and "time.sleep(60)" in line for line in said), said
    assert child.wait(timeout=10) == -9
    deadline = time.monotonic() + 10
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(orphan)


def test_a_service_started_before_the_test_may_fork(procs: Processes,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that existed before the test (here: a stand-in for sshd or PostgreSQL) may
    start children during it: they are the service's, not the test's leftovers."""
    monkeypatch.setattr(_leftovers, "GRACE_S", 0.1)
    service = procs.python(
        "import subprocess, sys, time\n"
        "sys.stdin.readline()\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n", stdin=subprocess.PIPE)
    time.sleep(0.2)
    before = _leftovers.processes()
    assert service.stdin is not None
    service.stdin.write(b"go\n")
    service.stdin.flush()
    deadline = time.monotonic() + 10
    while len(_leftovers.processes()) == len(before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_leftovers.processes()) > len(before)  # the service's child runs
    assert _leftovers.settle(before, os.getpid()) == []
