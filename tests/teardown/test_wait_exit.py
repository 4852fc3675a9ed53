"""Teardown's waits (``_signal_script.py``'s wait mode): they end when the last target exits,
not at the next tick of a fixed sleep, and never wait on a PID that now names another
process."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.teardown import Target, _signal_script
from cleanslate.teardown._host import send_signal, wait_gone
from cleanslate.teardown.scope import ROOT
from tests.conftest import Processes

BOOT = _signal_script._boot_time()
TICKS = os.sysconf("SC_CLK_TCK")


def _target(pid: int) -> dict[str, float]:
    found = _signal_script.identity(pid, BOOT, TICKS)
    assert found is not None
    return {"pid": pid, "create_time": found[0]}


def _sleeper(procs: Processes, seconds: float) -> int:
    return procs.python(f"import time; time.sleep({seconds})").pid


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_the_wait_ends_when_the_last_target_exits(
    procs: Processes, monkeypatch: pytest.MonkeyPatch, pidfd: bool,
) -> None:
    if not pidfd:
        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("this Python has no os.pidfd_open")
    targets = [_target(_sleeper(procs, 0.6)), _target(_sleeper(procs, 0.9))]
    time.sleep(0.2)  # both are running
    started = time.monotonic()
    _signal_script.wait_exit(targets, 20.0, BOOT, TICKS)
    waited = time.monotonic() - started
    assert 0.5 <= waited < 5.0, waited  # until the second exits (0.7 s from here), not 20 s
    for target in targets:
        found = _signal_script.identity(int(target["pid"]), BOOT, TICKS)
        assert found is None or found[1] == "Z"  # exited (our children stay zombies)


def test_the_wait_ends_at_its_deadline(procs: Processes) -> None:
    target = _target(_sleeper(procs, 30))
    started = time.monotonic()
    _signal_script.wait_exit([target], 0.3, BOOT, TICKS)
    assert 0.25 <= time.monotonic() - started < 3.0


def test_a_reused_pid_is_not_waited_on(procs: Processes) -> None:
    """A target whose PID now names a process with another start time has exited already."""
    target = _target(_sleeper(procs, 30))
    target["create_time"] -= 100.0
    started = time.monotonic()
    _signal_script.wait_exit([target], 10.0, BOOT, TICKS)
    assert time.monotonic() - started < 1.0


def test_teardown_wait_through_the_executor(procs: Processes) -> None:
    """``wait_gone`` ships the script to the host: one command returns the living targets, the
    moment the others exit."""
    short = _sleeper(procs, 0.4)
    long = _sleeper(procs, 30)
    time.sleep(0.2)
    targets = [Target(pid, _target(pid)["create_time"], "python3", "", ROOT, boot_time=BOOT)
               for pid in (short, long)]

    async def go() -> tuple[list[Target], list[Target], float]:
        executor = LocalExecutor(sys.executable)
        started = time.monotonic()
        first = await wait_gone(executor, targets[:1], 20.0)
        waited = time.monotonic() - started
        both = await wait_gone(executor, targets, 0.2)
        return first, both, waited

    first, both, waited = asyncio.run(go())
    assert first == [] and waited < 5.0
    assert [t.pid for t in both] == [long]


def test_a_clock_adjustment_between_snapshot_and_signal_is_not_a_reused_pid(
    procs: Processes,
) -> None:
    """``btime`` moves by a whole second when the clock is adjusted; a start time read against
    the old ``btime`` is compared as time since boot, so the live process is still signalled
    (CI once saw it taken for a reused PID and left alive). A reused PID is still refused."""
    pid = _sleeper(procs, 30)
    since_boot = _target(pid)["create_time"] - BOOT
    for shifted in (BOOT - 1.0, BOOT + 1.0):
        before = Target(pid, round(shifted + since_boot, 2), "python3", "", ROOT,
                        boot_time=shifted)
        state = asyncio.run(send_signal(LocalExecutor(sys.executable), [before], "0"))
        assert state["sent"] == [pid] and not state["reused"], (shifted, state)
        reused = Target(pid, round(shifted + since_boot - 5.0, 2), "python3", "", ROOT,
                        boot_time=shifted)
        state = asyncio.run(send_signal(LocalExecutor(sys.executable), [reused], "0"))
        assert state["reused"] == [pid] and not state["sent"], (shifted, state)
    # a target read in another boot (btime an hour apart) at the same time since boot: refused
    other_boot = Target(pid, round(BOOT - 3600.0 + since_boot, 2), "python3", "", ROOT,
                        boot_time=BOOT - 3600.0)
    state = asyncio.run(send_signal(LocalExecutor(sys.executable), [other_boot], "0"))
    assert state["reused"] == [pid] and not state["sent"], state
    # without the boot time, the script reads btime itself: a second off is another process
    unshifted = Target(pid, round(BOOT - 1.0 + since_boot, 2), "python3", "", ROOT)
    state = asyncio.run(send_signal(LocalExecutor(sys.executable), [unshifted], "0"))
    assert state["reused"] == [pid]
