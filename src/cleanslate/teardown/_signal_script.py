"""Send a signal to processes, but only to the ones that are still who we think they are.

A self-contained, stdlib-only script (shipped to a host's ``python3`` like the collector). For
each target ``{"pid": P, "create_time": T}`` it reads ``/proc/P/stat`` and signals P only when
its start time still equals T (the PID was not reused by another process since the snapshot).

Input (argv[1], JSON): ``{"signal": "SIGTERM", "targets": [{"pid": .., "create_time": ..,
"boot": ..}]}``, where ``boot`` (optional) is the boot time that ``create_time`` was computed
against. With it, the comparison is of the time since boot, which never moves; without it, of
``btime`` now plus that time, and ``btime`` moves by a whole second when the clock is adjusted
(CI once saw a live process taken for a reused PID so, 37 minutes after its boot time was read).
Output (stdout, JSON): ``{"sent": [..], "gone": [..], "reused": [..], "zombie": [..],
"d_state": [..], "errors": {pid: message}}``.

With ``"signal": "0"`` and ``"wait_s": S`` it first waits, up to S seconds, until every target has
exited, and then reports as above. The wait is event-driven where the kernel allows it: a pidfd
per target (Linux 5.3 and later) becomes readable the moment its process exits, zombie
included, and one ``poll`` waits on all of them. A pidfd is opened by PID, so the target's start
time is read again after the open: a PID reused in between is not waited on. Without pidfds
(older kernels, a seccomp filter) it polls ``/proc`` every 10 ms.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

#: Seconds between ``/proc`` readings when the kernel gives no pidfd.
POLL_S = 0.01


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def identity(pid: int, boot: float, ticks: int) -> tuple[float, str] | None:
    """``(create_time, state)`` of a live PID, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return round(boot + int(fields[19]) / ticks, 2), fields[0]


#: How far ``btime`` may have moved since the target's boot time was read and still be the
#: same boot (a clock adjustment moves it by a second; a reboot by the old boot's uptime).
BOOT_SHIFT_S = 2.0


def matches(target: dict[str, Any], create_time: float, boot: float) -> bool:
    """Does a process that started at ``create_time`` (against ``boot``) have the target's
    start time? Compared as time since boot when the target says which boot time it used, and
    only within the same boot (a process of a later boot at the same uptime is another one)."""
    expected = target.get("create_time")
    if expected is None:
        return True
    given = target.get("boot")
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        if abs(boot - float(given)) > BOOT_SHIFT_S:
            return False
        return abs((create_time - boot) - (float(expected) - float(given))) <= 0.02
    return abs(create_time - float(expected)) <= 0.02


def _same(target: dict[str, Any], boot: float, ticks: int) -> bool:
    """Is the target still alive (not a zombie) and the process we were given?"""
    found = identity(int(target["pid"]), boot, ticks)
    if found is None or found[1] == "Z":
        return False
    return matches(target, found[0], boot)


def wait_exit(targets: list[dict[str, Any]], seconds: float, boot: float, ticks: int) -> None:
    """Return once every target has exited (or was never the process given), or after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    fds: list[int] = []
    polled: list[dict[str, Any]] = []
    try:
        for target in targets:
            if not _same(target, boot, ticks):
                continue
            try:
                fd = os.pidfd_open(int(target["pid"]))
            except ProcessLookupError:
                continue
            except (AttributeError, OSError):
                polled.append(target)
                continue
            fds.append(fd)
            if not _same(target, boot, ticks):  # exited or reused before the open
                os.close(fds.pop())
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        waiting = set(fds)
        while waiting or polled:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            step = min(left, POLL_S) if polled else left
            for fd, _event in poller.poll(step * 1000):
                waiting.discard(fd)
                poller.unregister(fd)
            polled = [t for t in polled if _same(t, boot, ticks)]
    finally:
        for fd in fds:
            os.close(fd)


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    name = spec.get("signal", "SIGTERM")
    signum = 0 if name == "0" else getattr(signal, name)
    boot = _boot_time()
    ticks = os.sysconf("SC_CLK_TCK")
    if signum == 0 and float(spec.get("wait_s") or 0) > 0:
        wait_exit(spec.get("targets", []), float(spec["wait_s"]), boot, ticks)
    out: dict[str, Any] = {"sent": [], "gone": [], "reused": [], "zombie": [], "d_state": [],
                           "errors": {}}
    for target in spec.get("targets", []):
        pid = int(target["pid"])
        found = identity(pid, boot, ticks)
        if found is None:
            out["gone"].append(pid)
            continue
        create_time, state = found
        if not matches(target, create_time, boot):
            out["reused"].append(pid)
            continue
        if state == "Z":
            out["zombie"].append(pid)  # dead already; its parent has not reaped it yet
            continue
        if state == "D":
            out["d_state"].append(pid)
        try:
            os.kill(pid, signum)
            out["sent"].append(pid)
        except ProcessLookupError:
            out["gone"].append(pid)
        except OSError as exc:
            out["errors"][str(pid)] = str(exc)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
