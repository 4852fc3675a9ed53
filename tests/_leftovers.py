"""The guard between tests: a test that leaves a process behind fails, and what it left is ended.

Only in the session's private PID namespace (:mod:`tests._isolation`), where every process is
this session's. Before each test the guard reads which processes exist; after the test's own
fixtures are torn down it reads again. A process that is new, still running (not a zombie) and
not a service or a descendant of one (a process that was already there, or that a fixture wider
than a test started: PostgreSQL and its backends, sshd and its sessions, slurmd and its job
steps) is a leftover.
The engines' supervisors daemonize, so an orphaned engine is a child of the init and counts.

The guard waits up to :data:`GRACE_S` for leftovers to end on their own (a server's last worker
exiting just after its root was reaped), then ends what is left by PID and start time, and
fails the test naming each process.

Loaded as a plugin (``-p tests._leftovers`` in pyproject's ``addopts``) for its
:func:`pytest_fixture_setup`: a hook in ``tests/conftest.py`` is not called for the session's
fixtures. The guard itself is the autouse fixture ``_no_leftovers`` of ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: How long a test's new processes get to end on their own after its fixtures are torn down.
GRACE_S = 15.0

#: ``(pid, start)`` of the processes that fixtures wider than a test started (sshd, PostgreSQL,
#: Slurm): services, like those that ran before the test, even when a test set them up first.
SERVICES: set[tuple[int, int]] = set()


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: a PID reused later is another process
    state: str

    @property
    def key(self) -> tuple[int, int]:
        return self.pid, self.start


def _read(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return Proc(pid=pid, ppid=int(fields[1]), start=int(fields[19]), state=fields[0])


def processes() -> dict[int, Proc]:
    """Every process this namespace shows now, by PID."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _read(int(entry))) is not None:
            out[proc.pid] = proc
    return out


def leftovers(before: dict[int, Proc], me: int) -> list[Proc]:
    """The running processes that are new since ``before`` and hang from no process that was
    already there, except this pytest (``me``) and the namespace's init (PID 1)."""
    now = processes()
    known = {p.key for p in before.values()}
    services = {p.key for p in before.values() if p.pid not in (me, 1)} | SERVICES
    found = []
    for proc in now.values():
        if proc.key in known or proc.key in services or proc.state in ("Z", "X") \
                or proc.pid == me:
            continue
        parent, hops = now.get(proc.ppid), 0
        while parent is not None and parent.pid not in (1, me) and hops < 64:
            if parent.key in services:
                break  # a service's own child (a database backend, an ssh session)
            parent, hops = now.get(parent.ppid), hops + 1
        else:
            found.append(proc)
    return found


def describe(proc: Proc) -> str:
    try:
        raw = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    except OSError:
        raw = b""
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return f"PID {proc.pid} (parent {proc.ppid}): {text or '?'}"


def settle(before: dict[int, Proc], me: int) -> list[str]:
    """Wait up to :data:`GRACE_S` for the test's leftovers to end; end those still there (by
    PID, after checking the start time) and return what they were. Empty: nothing was left."""
    deadline = time.monotonic() + GRACE_S
    left = leftovers(before, me)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftovers(before, me)
    said = [describe(p) for p in left]
    for proc in left:
        again = _read(proc.pid)
        if again is not None and again.start == proc.start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    return said


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Generator[
        None, Any, Any]:
    """The processes that a fixture wider than one test starts are services for the guard
    (:data:`SERVICES`), whichever test set it up first."""
    if fixturedef.scope == "function" or os.environ.get("CLEANSLATE_TEST_ISOLATED") != \
            "isolated":
        return (yield)
    before = processes()
    try:
        return (yield)
    finally:
        SERVICES.update(p.key for p in processes().values()
                        if p.pid not in before or p.key != before[p.pid].key)
