"""PID reuse made exact: start another user's process with a given PID, outside this process's
tree.

Inside the test session's private PID namespace (``tests/_isolation.py``), root may write
``/proc/sys/kernel/ns_last_pid``: the next process created gets that number plus one. A helper
(root) forks an intermediate process that writes it and forks until its child has the PID asked
for (another process of the namespace may take the number first: it tries again), then exits,
so the process that stays is re-parented to the namespace's init, like a daemon that another
user started: not this test's descendant (which teardown protects as "a command it started").
The child then

- ``leader``: starts a session of its own (its PID is its session and group number), names
  itself ``comm``, drops to ``uid`` and sleeps;
- ``orphan``: starts a session, forks a member of it (named ``comm``, as ``uid``) and exits, so
  the session's number is carried by a process whose leader is gone;
- ``family``: a ``leader`` with a child of its own (named ``comm``, as ``uid``), which the
  caller finds as the leader's child.

:class:`Strangers` (the fixture ``strangers``) ends each process it started, by pidfd after
checking its start time, when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import isolated

HELPER = r"""
import ctypes, os, sys, time
target, uid, comm, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)

def become(name):
    libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    os.setgid(uid)
    os.setuid(uid)

def start():
    for attempt in range(200):
        if target:
            with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
                fh.write(str(target - 1))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            if target and os.getpid() != target:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # the test's pipes stay the test's
                os.dup2(null, fd)
            os.setsid()
            if mode == "family" and os.fork() == 0:
                become(comm)
                time.sleep(300)
                os._exit(0)
            if mode in ("leader", "family"):
                become(comm)
                os.write(write, f"{os.getpid()}\n".encode())
                time.sleep(300)
                os._exit(0)
            member = os.fork()
            if member == 0:
                become(comm)
                time.sleep(300)
                os._exit(0)
            while open(f"/proc/{member}/comm").read().strip() != comm[:15]:
                time.sleep(0.002)
            os.write(write, f"{member}\n".encode())
            os._exit(0)
        os.close(write)
        answer = os.read(read, 64).decode()
        os.close(read)
        if pid == target or not target:
            return answer.strip()
        os.waitpid(pid, 0)
    return "0"

read, write = os.pipe()
if os.fork() == 0:  # the intermediate: exits once the process that stays is started
    os.close(read)
    os.write(write, (start() + "\n").encode())
    os._exit(0)
os.close(write)
print(os.read(read, 64).decode().strip(), flush=True)
os.wait()
"""

NOBODY = 65534


def need_pid_namespace() -> None:
    """Skip unless this session runs in its private PID namespace as root."""
    if not isolated() or os.geteuid() != 0 or \
            not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("exact PID reuse needs the private PID namespace of the test session, as "
                    "root (/proc/sys/kernel/ns_last_pid)")


def start_time(pid: int) -> str:
    """Field 22 of ``/proc/PID/stat``: the process's start in clock ticks since boot."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def stat_field(pid: int, index: int) -> str:
    """A field of ``/proc/PID/stat`` after the name (0: state, 1: ppid, 2: group, 3: session)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[index]


def real_uid(pid: int) -> int:
    """The ``Uid:`` of ``/proc/PID/status`` (its files stay root's: setuid clears dumpable)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


class Strangers:
    """Processes of "another user", each ended by this object (by PID and start time)."""

    def __init__(self) -> None:
        self.started: list[tuple[int, str]] = []

    def dead_pid(self) -> int:
        """A PID that a process of this test had and no longer has (a dead run's number)."""
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return pid

    def spawn_at(self, pid: int, *, comm: str, uid: int = NOBODY, mode: str = "leader") -> int:
        """Start a process with PID ``pid`` (any PID: 0; ``mode`` as in the module docstring);
        return the PID of the process that stays, once it runs as ``uid``."""
        helper = subprocess.run([sys.executable, "-c", HELPER, str(pid), str(uid), comm, mode],
                                capture_output=True, text=True, check=True, timeout=30)
        stayed = int(helper.stdout.strip() or 0)
        assert stayed, f"no process could be started with PID {pid}: {helper.stderr}"
        self.started.append((stayed, start_time(stayed)))
        deadline = time.monotonic() + 5
        while real_uid(stayed) != uid or \
                Path(f"/proc/{stayed}/comm").read_text().strip() != comm[:15]:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        return stayed

    def end(self) -> None:
        for pid, ticks in self.started:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(pid)
                try:
                    if start_time(pid) == ticks:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                finally:
                    os.close(fd)


@pytest.fixture
def strangers() -> Iterator[Strangers]:
    need_pid_namespace()
    made = Strangers()
    try:
        yield made
    finally:
        made.end()
